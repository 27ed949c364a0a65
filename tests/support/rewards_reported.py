"""The inputs of the public bug reports against the reward, with the verdict each must get (the report's bracket).

Used in-process (``tests/unit/rewards/test_scoring.py``) and through verl's reward-loop managers with the killable
workers (``tests/integration/rewards/test_reward_loop.py``).
"""

PAD = "Reasoning. " * 30  # 330 characters of filler

#: (data_source, response, ground truth, expected acc)
REPORTED = [
    # the number fast path glued lists and kept only what follows the last "="
    ("math500", "\\boxed{357}", "3, 5, 7", False),
    ("math_dapo", "\\boxed{1,2}", "12", False),
    ("dapo-math-17k", "\\boxed{1,2}", "12", False),
    ("math500", "\\boxed{1}", "0,1", False),
    ("math500", "\\boxed{3x + 4y + 14=0}", "3x-y+13=0", False),
    ("math500", "\\boxed{x^2 = 4}", "x = 4", False),
    ("math_dapo", "\\boxed{x^2 = 4}", "x = 4", False),
    # near misses accepted by math-verify's default 6-digit rounding
    ("math500", "\\boxed{\\frac{1}{2006!}}", "\\frac{1}{2004!}", False),
    ("minerva", "\\boxed{0.0000002}", "0.0000001", False),
    # answers that were missed
    ("math500", "\\fbox{42}", "42", True),
    ("aime24", "\\fbox{42}", "42", True),
    ("math_dapo", "\\fbox{42}", "42", True),
    ("math500", "so our answer is $\\boxed 2$.", "2", True),
    ("math_dapo", "so our answer is $\\boxed 2$.", "2", True),
    ("math_dapo", PAD + "\n**Answer:** 42", "42", True),
    ("math_dapo", PAD + "\nAnswer: **42**", "42", True),
    ("math_dapo", PAD + "\\boxed{42}.\n\n**Answer:** 42", "42", True),
    ("math500", "$\\boxed{3}$, $\\boxed{5}$ and $\\boxed{7}$", "3, 5, 7", True),
    ("olympiadbench", "$\\boxed{69}$, $\\boxed{84}$", "69,84", True),
]
