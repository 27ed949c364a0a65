"""Find the final answer in a model response: boxes (``\\boxed{}``, ``\\fbox{}``, ``\\boxed x``), runs of boxes, and
DAPO's ``Answer:`` line with markdown emphasis removed.

Box forms (every route):

* ``\\boxed{...}`` and ``\\fbox{...}``, brace matched as in verl's ``math_reward.last_boxed_only_string`` (every
  ``{``/``}`` counts, escaped ones included);
* ``\\boxed x`` without braces (``so our answer is $\\boxed 2$.``): as in verl's ``math_reward.last_boxed_only_string``
  the content runs to the next ``$``; here it also ends at a line break, ``\\]`` or ``\\)``, and a final ``.`` is
  dropped.

Unlike verl's function, the *last* box wins whatever its form (verl returns a ``\\boxed x`` anywhere in the text in
preference to a later ``\\boxed{}``, and reads ``\\fbox`` only when there is no ``\\boxed`` at all).

**Several boxes** (:func:`final_box_answer`): a run of boxes separated only by a list separator (``,``, ``and``,
``or``, ``, and``, ``, or``), each optionally inside its own ``$...$`` / ``\\(...\\)`` / ``\\[...\\]``, is read as one
list answer, the contents joined with ``", "``: ``$\\boxed{3}$, $\\boxed{5}$ and $\\boxed{7}$`` gives ``"3, 5, 7"``.
That is math-verify's own rule (``math_verify.parser``, the ``next{i}_`` box groups joined by ``,?and|,?or|,`` into
one ``FiniteSet``). Boxes separated by any other text are separate answers, and the last one is the final answer.
The same rule is used on every route: it lets a multi-answer benchmark problem be answered with one box per value,
and on the single-integer DAPO routes it turns a hedge (``\\boxed{41}, \\boxed{42}``) into the wrong list ``41, 42``
instead of rewarding the last guess.

**DAPO's answer line** (:func:`dapo_answer_line`): verl's rule (``math_dapo.is_correct_minerva``: the last match
of ``(?i)Answer\\s*:\\s*([^\\n]+)`` in the last 300 characters), after removing markdown emphasis around the word
``Answer`` and the colon (``**Answer:** 42``, ``**Answer**: 42``) and around the captured answer
(``Answer: **42**``).
"""

from __future__ import annotations

import dataclasses
import re

from stapo_verl.rewards.verl_rules import DAPO_ANSWER_PATTERN, DAPO_TAIL_CHARS

__all__ = [
    "Box",
    "dapo_answer_line",
    "final_box_answer",
    "find_boxes",
    "last_box",
    "strip_markdown_emphasis",
]

_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_OPEN_DELIM = r"(?:\$\$|\$|\\\(|\\\[)"
_CLOSE_DELIM = r"(?:\$\$|\$|\\\)|\\\])"
#: What may stand between two boxes of one list answer (math-verify's separators ``,?and|,?or|,``).
_LIST_GAP = re.compile(rf"\s*{_CLOSE_DELIM}?\s*(?:,\s*and|,\s*or|and|or|,)\s*{_OPEN_DELIM}?\s*")
#: ``\boxed x``: the content ends at ``$``, a line break, ``\]``, ``\)`` or the end of the text.
_BRACELESS_END = re.compile(r"\$|\n|\\\]|\\\)")
_EMPHASIS = r"(?:\*\*|__|\*|_)"
_MD_ANSWER_KEY = re.compile(rf"(?i){_EMPHASIS}?(answer){_EMPHASIS}?\s*:{_EMPHASIS}?")
_MD_LEAD = re.compile(r"^(?:[*_]+\s*)+")
_MD_TRAIL = re.compile(r"(?:\s*[*_]+)+(\.?)\s*$")


@dataclasses.dataclass(frozen=True)
class Box:
    """One complete box in a text.

    Attributes:
        start: index of the backslash of ``\\boxed`` / ``\\fbox``.
        end: index just after the box (after its closing brace, or after a brace-less content).
        content: what is inside (stripped for the brace-less form).
    """

    start: int
    end: int
    content: str


def _box_at(text: str, start: int, cmd_end: int) -> Box | None:
    """The box whose command spans ``text[start:cmd_end]``, or None when it is not complete."""
    i = cmd_end
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        depth = 0
        for j in range(i, n):
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return Box(start, j + 1, text[i + 1 : j])
        return None  # never closed: a truncated response
    if i == cmd_end:  # "\boxed2", "\boxed\frac12": not a form we read
        return None
    stop = _BRACELESS_END.search(text, i)
    end = stop.start() if stop else n
    content = text[i:end].strip()
    if content.endswith("."):
        content = content[:-1].rstrip()
    return Box(start, end, content) if content else None


def find_boxes(text: str) -> tuple[list[Box], bool]:
    """All complete boxes of ``text`` in order, and whether the *last* box command is complete.

    Args:
        text: a model response.

    Returns:
        ``(boxes, last_complete)``: ``last_complete`` is False when the last ``\\boxed``/``\\fbox`` in the text is
        never closed (a truncated response: no final answer, as in verl) or has no content; True when there is no
        box command at all.
    """
    boxes: list[Box] = []
    last_complete = True
    for m in _COMMAND.finditer(text):
        box = _box_at(text, m.start(), m.end())
        if box is None:
            last_complete = False
            continue
        last_complete = True
        boxes.append(box)
    # A box nested in an earlier one ("\boxed{\boxed{5}}") is found twice; keep the outermost.
    outer: list[Box] = []
    for box in boxes:
        if outer and box.start < outer[-1].end:
            continue
        outer.append(box)
    return outer, last_complete


def last_box(text: str) -> Box | None:
    """The last complete box of ``text`` (None when there is none or the last one is unclosed)."""
    boxes, complete = find_boxes(text)
    return boxes[-1] if boxes and complete else None


def final_box_answer(text: str, tail_chars: int | None = None) -> str | None:
    """The final boxed answer of ``text``: the last box, or the run of list-separated boxes that ends with it.

    Args:
        text: a model response.
        tail_chars: when given, the last box must close inside the last ``tail_chars`` characters (the strict DAPO
            routes use 300, like verl's ``math_dapo.compute_score``); ``None`` accepts a box anywhere.

    Returns:
        The content (a run of boxes joined with ``", "``), or None when there is no usable box.

    Raises:
        ValueError: ``tail_chars`` is not None and < 1.
    """
    if tail_chars is not None and tail_chars < 1:
        raise ValueError(f"tail_chars must be None or >= 1, got {tail_chars!r}")
    boxes, complete = find_boxes(text)
    if not boxes or not complete:
        return None
    if tail_chars is not None and boxes[-1].end <= len(text) - tail_chars:
        return None
    run = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        if not _LIST_GAP.fullmatch(text, prev.end, run[0].start):
            break
        run.insert(0, prev)
    return ", ".join(b.content for b in run) if len(run) > 1 else run[0].content


def strip_markdown_emphasis(answer: str) -> str:
    """Remove markdown emphasis (``**``, ``__``, ``*``, ``_``) around an answer: ``"** 42"`` → ``"42"``,
    ``"**42**."`` → ``"42."``; inner characters are kept (``2**10`` stays)."""
    answer = _MD_LEAD.sub("", answer.strip())
    return _MD_TRAIL.sub(r"\1", answer).strip()


def dapo_answer_line(text: str, tail_chars: int = DAPO_TAIL_CHARS) -> str | None:
    """The answer on DAPO's ``Answer:`` line: verl's rule plus markdown stripping.

    verl (``math_dapo.compute_score`` → ``verify`` → ``is_correct_minerva``) takes the last match of
    :data:`~stapo_verl.rewards.verl_rules.DAPO_ANSWER_PATTERN` in ``solution_str[-300:]``. Here markdown emphasis
    around ``Answer`` and its colon is removed first (``**Answer:** 42`` and ``**Answer**: 42`` read as ``Answer: 42``)
    and then around the captured text (``Answer: **42**`` gives ``42``).

    Args:
        text: a model response.
        tail_chars: the window at the end of ``text`` (verl: 300).

    Returns:
        The answer text (may be empty), or None when no line matches.

    Raises:
        ValueError: ``tail_chars`` < 1.
    """
    if tail_chars < 1:
        raise ValueError(f"tail_chars must be >= 1, got {tail_chars!r}")
    tail = _MD_ANSWER_KEY.sub(r"\1:", text[-tail_chars:])
    matches = re.findall(DAPO_ANSWER_PATTERN, tail)
    if not matches:
        return None
    return strip_markdown_emphasis(matches[-1])
