"""verl's published answer normalisers, copied so that a reward worker never imports ``verl`` (and torch).

Faithful copies of three pieces of verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its
affiliates; https://github.com/volcengine/verl), themselves adapted from EleutherAI's lm-evaluation-harness
(https://github.com/EleutherAI/lm-evaluation-harness, ``lm_eval/tasks/hendrycks_math``):

* :func:`normalize_final_answer` (with :data:`SUBSTITUTIONS` and :data:`REMOVED_EXPRESSIONS`) is
  ``verl.utils.reward_score.math_dapo.normalize_final_answer``, the normaliser of verl's DAPO scorer;
* :func:`strip_string` (with its helpers) is ``verl.utils.reward_score.math_reward.strip_string``, the Hendrycks
  MATH normaliser;
* :data:`DAPO_ANSWER_PATTERN` and :data:`DAPO_TAIL_CHARS` are the default ``answer_pattern`` of
  ``verl.utils.reward_score.math_dapo.is_correct_minerva`` and the window of ``math_dapo.compute_score``
  (``solution_str[-300:]``).

Why copies: ``import verl`` imports torch and every verl plugin (about 5 s); a reward worker that is killed and
replaced after a timeout must start in milliseconds. The copies are kept byte-for-byte in behaviour: the tests
(``tests/unit/rewards/test_verl_parity.py``) import verl's own functions and compare them with these on every
vendored gold answer, its perturbations and edge cases, so a verl upgrade that changes them is noticed.

These normalisers are lossy (``normalize_final_answer`` keeps what follows the last ``=`` and glues ``1,2`` into
``12``); the scorers never accept an answer on their word alone (see :mod:`stapo_verl.rewards.dapo`).
"""

from __future__ import annotations

import re

__all__ = [
    "DAPO_ANSWER_PATTERN",
    "DAPO_TAIL_CHARS",
    "REMOVED_EXPRESSIONS",
    "SUBSTITUTIONS",
    "normalize_final_answer",
    "strip_string",
]

#: ``math_dapo.is_correct_minerva``'s default ``answer_pattern``: DAPO's published prompt asks for a last line
#: ``Answer: $Answer``.
DAPO_ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"
#: ``math_dapo.compute_score`` keeps the last 300 characters of a response ("The longest answer in MATH-500 has 159
#: characters").
DAPO_TAIL_CHARS = 300

# ----------------------------------------------------------------- verl.utils.reward_score.math_dapo

SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

REMOVED_EXPRESSIONS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
)


def normalize_final_answer(final_answer: str) -> str:
    """verl's ``math_dapo.normalize_final_answer`` (copy).

    Args:
        final_answer: an answer string, e.g. a box content or the rest of an ``Answer:`` line.

    Returns:
        The normalised string: what follows the last ``=``; spaces, units, ``\\text{}``, ``$`` removed;
        ``\\fracab`` → ``\\frac{a}{b}``; ``1,000`` → ``1000`` (and ``1,2`` → ``12``). Never raises for a str.
        Super-linear on long adversarial input (one ``$`` then 100k characters: minutes): callers cap the length.
    """
    final_answer = final_answer.split("=")[-1]

    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")

    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)

    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")

    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")

    return final_answer.strip()


# ----------------------------------------------------------------- verl.utils.reward_score.math_reward


def fix_fracs(string: str) -> str:
    """verl's ``math_reward.fix_fracs``: ``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1b`` → ``\\frac{1}{b}``."""
    substrs = string.split("\\frac")
    new_str = substrs[0]
    if len(substrs) > 1:
        substrs = substrs[1:]
        for substr in substrs:
            new_str += "\\frac"
            if substr[0] == "{":
                new_str += substr
            else:
                try:
                    assert len(substr) >= 2
                except Exception:
                    return string
                a = substr[0]
                b = substr[1]
                if b != "{":
                    if len(substr) > 2:
                        post_substr = substr[2:]
                        new_str += "{" + a + "}{" + b + "}" + post_substr
                    else:
                        new_str += "{" + a + "}{" + b + "}"
                else:
                    if len(substr) > 2:
                        post_substr = substr[2:]
                        new_str += "{" + a + "}" + b + post_substr
                    else:
                        new_str += "{" + a + "}" + b
    string = new_str
    return string


def fix_a_slash_b(string: str) -> str:
    """verl's ``math_reward.fix_a_slash_b``: ``3/4`` → ``\\frac{3}{4}`` (integers only)."""
    if len(string.split("/")) != 2:
        return string
    a = string.split("/")[0]
    b = string.split("/")[1]
    try:
        a = int(a)
        b = int(b)
        assert string == "{}/{}".format(a, b)
        new_string = "\\frac{" + str(a) + "}{" + str(b) + "}"
        return new_string
    except Exception:
        return string


def remove_right_units(string: str) -> str:
    """verl's ``math_reward.remove_right_units``: drop everything from ``\\text{ `` on.

    Raises:
        AssertionError: ``\\text{ `` occurs more than once (verl's own behaviour).
    """
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2
        return splits[0]
    else:
        return string


def fix_sqrt(string: str) -> str:
    """verl's ``math_reward.fix_sqrt``: ``\\sqrt3`` → ``\\sqrt{3}``.

    Raises:
        IndexError: a trailing ``\\sqrt`` (verl's own behaviour).
    """
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if split[0] != "{":
            a = split[0]
            new_substr = "\\sqrt{" + a + "}" + split[1:]
        else:
            new_substr = "\\sqrt" + split
        new_string += new_substr
    return new_string


def strip_string(string: str) -> str:
    """verl's ``math_reward.strip_string`` (copy): the Hendrycks MATH answer normaliser.

    Args:
        string: an answer string.

    Returns:
        The normalised string (``\\dfrac``/``\\tfrac`` → ``\\frac``, ``\\left``/``\\right``, degrees, ``\\$``, units
        after ``\\text{ ``, ``\\%`` and spaces removed, a short ``k = `` prefix dropped, ``0.5`` → ``\\frac{1}{2}``,
        ``a/b`` → ``\\frac{a}{b}``).

    Raises:
        AssertionError, IndexError: on the inputs where verl's function raises (two ``\\text{ ``, a trailing
            ``\\frac``/``\\sqrt``); verl's ``math_reward.is_equiv`` then compares the raw strings.
    """
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac")
    string = string.replace("dfrac", "frac")
    string = string.replace("\\left", "")
    string = string.replace("\\right", "")
    string = string.replace("^{\\circ}", "")
    string = string.replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = remove_right_units(string)
    string = string.replace("\\\\%", "")
    string = string.replace("\\%", "")
    string = string.replace(" .", " 0.")
    string = string.replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = fix_sqrt(string)
    string = string.replace(" ", "")
    string = fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    string = fix_a_slash_b(string)
    return string
