"""Answer extraction: box forms, runs of boxes, the 300-character tail, DAPO's Answer: line with markdown."""

from __future__ import annotations

import time

import pytest

from stapo_verl.rewards.extract import (
    dapo_answer_line,
    final_box_answer,
    find_boxes,
    last_box,
    strip_markdown_emphasis,
)

PAD = "Reasoning. " * 30  # 330 characters


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{42}.", "42"),
        ("so \\fbox{42}.", "42"),
        ("so our answer is $\\boxed 2$.", "2"),
        ("so our answer is \\boxed 17.", "17"),
        ("\\boxed  {7}", "7"),
        ("so \\boxed{\\frac{a^{2}}{b_{1}}}.", "\\frac{a^{2}}{b_{1}}"),  # nested braces
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces count as braces, as in verl
        ("first \\boxed{4}, then we see \\fbox{5}", "5"),  # the last box wins, whatever its form
        ("first \\boxed 4$ then \\boxed{5}", "5"),  # verl would return the brace-less one
        ("\\boxed{\\boxed{5}}", "\\boxed{5}"),  # the outermost of nested boxes
        ("\\boxed{}", ""),  # an empty box is an (empty, wrong) answer
    ],
)
def test_box_forms(text, answer):
    assert final_box_answer(text) == answer


@pytest.mark.parametrize(
    "text",
    ["no box at all", "\\boxed{34} then \\boxed{3", "ends with \\boxed", "\\boxedanswer{3}", "\\boxed$", "\\boxed{" + "{" * 5000],
)
def test_no_usable_box(text):
    assert final_box_answer(text) is None


def test_truncated_last_box_means_no_answer_even_after_a_complete_one():
    boxes, complete = find_boxes("\\boxed{34} and finally \\boxed{3")
    assert [b.content for b in boxes] == ["34"] and complete is False
    assert last_box("\\boxed{34} and finally \\boxed{3") is None


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("$\\boxed{3}$, $\\boxed{5}$ and $\\boxed{7}$", "3, 5, 7"),
        ("\\boxed{3}, \\boxed{5}, \\boxed{7}", "3, 5, 7"),
        ("\\(\\boxed{1}\\) or \\(\\boxed{-1}\\)", "1, -1"),
        ("$\\boxed{2}$, and $\\boxed{4}$.", "2, 4"),
        ("\\boxed{(1,2)}, \\boxed{(3,4)}", "(1,2), (3,4)"),
        # other text between boxes: separate answers, the last one counts
        ("\\boxed{3} is wrong, the answer is \\boxed{5}", "5"),
        ("\\boxed{3}. Then \\boxed{5}", "5"),
    ],
)
def test_runs_of_boxes_are_one_list_answer(text, answer):
    assert final_box_answer(text) == answer


def test_tail_window():
    assert final_box_answer(PAD + "\\boxed{34}", tail_chars=300) == "34"
    assert final_box_answer("\\boxed{34}" + PAD, tail_chars=300) is None  # closed > 300 characters before the end
    assert final_box_answer("\\boxed{34}" + PAD, tail_chars=None) == "34"
    long_answer = "+".join(["x"] * 200)  # 399 characters: the box starts before the window, closes inside it
    assert final_box_answer(PAD + f"\\boxed{{{long_answer}}}", tail_chars=300) == long_answer
    with pytest.raises(ValueError, match="tail_chars must be None or >= 1, got 0"):
        final_box_answer("\\boxed{1}", tail_chars=0)


def test_linear_time_on_pathological_input():
    t0 = time.perf_counter()
    assert final_box_answer("x" * 200_000 + "\\boxed{34}") == "34"
    assert final_box_answer("\\boxed{" + "{" * 100_000) is None
    assert final_box_answer("\\boxed{1}" * 20_000) == "1"  # 20k boxes in one run: read as a 20k-item list
    assert dapo_answer_line("Answer: 1\n" * 50_000) == "1"
    # a super-linear regression would take minutes; the bound is loose for loaded CI machines
    assert time.perf_counter() - t0 < 20.0


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("...\nAnswer: 42", "42"),
        ("...\n**Answer:** 42", "42"),
        ("...\n**Answer**: 42", "42"),
        ("...\nAnswer: **42**", "42"),
        ("...\n**Answer: 42**", "42"),
        ("...\n__Answer:__ 42", "42"),
        ("...\n### Final Answer: 42", "42"),
        ("...\nanswer: $42$", "$42$"),
        ("...\n**Answer:**\n\\boxed{42}", "\\boxed{42}"),  # verl's \s* runs over the line break
        ("Answer: 41\n...\nAnswer: **42**.", "42."),  # the last line wins; a final period is kept
        ("...\nAnswer: 2**10", "2**10"),  # inner ** is not emphasis
    ],
)
def test_dapo_answer_line(text, answer):
    assert dapo_answer_line(text) == answer


def test_dapo_answer_line_is_read_in_the_tail_only():
    assert dapo_answer_line("Answer: 42\n" + PAD) is None
    assert dapo_answer_line("no line here") is None
    with pytest.raises(ValueError, match="tail_chars must be >= 1, got 0"):
        dapo_answer_line("Answer: 1", tail_chars=0)


def test_strip_markdown_emphasis():
    assert strip_markdown_emphasis(" ** 42") == "42"
    assert strip_markdown_emphasis("**42**.") == "42."
    assert strip_markdown_emphasis("_x_") == "x"
    assert strip_markdown_emphasis("2**10") == "2**10"
