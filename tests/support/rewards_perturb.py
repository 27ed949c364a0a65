"""Test responses built around a gold answer: the gold itself, notation variants, answer forms and perturbations.

:func:`cases` gives, for one gold answer, a list of :class:`Case` (kind, answer text, response text). The kinds:

* ``gold``: the gold in ``$\\boxed{...}$`` (must score correct);
* ``first_digit``: the first digit d → (d+1) mod 10 (another row's gold when there is no digit): the perturbation
  of the agreement table, kept from the earlier agreement test;
* ``variant``: the gold in another notation (an integer ``n`` as ``n.0``, ``\\frac`` as ``\\dfrac``): must score
  correct;
* ``form``: the gold in another answer form: ``\\fbox{}``, ``\\boxed x``, one box per list item, and on DAPO routes
  the ``Answer:`` line plain and in markdown bold, after a box: must score correct;
* perturbations, which may or may not be equal to the gold (the reference decides): ``list_reorder``,
  ``list_merge``, ``list_split``, ``list_drop``, ``equation_lhs``, ``equation_swap``, ``equation_rhs``,
  ``off_by_one``, ``digit_shift``, ``power``, ``factorial``, ``sign``, ``unit``, ``percent``, ``near_miss``,
  ``other_row``, and every perturbation in the forms above (``*@fbox``, ``*@line``, ...).
"""

from __future__ import annotations

import dataclasses
import re

PREFIX = "Let me work through this carefully.\n"
PAD = "Reasoning. " * 30  # 330 characters: pushes earlier text out of the 300-character DAPO window

_INT = re.compile(r"\d+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_POWER = re.compile(r"\^\{?(\d+)\}?")
_FACTORIAL = re.compile(r"(\d+)!")


@dataclasses.dataclass(frozen=True)
class Case:
    """One test response: ``kind`` (module docstring), the answer text it carries, and the response."""

    kind: str
    answer: str
    response: str


def box(answer: str) -> str:
    """The default response: the answer in ``$\\boxed{...}$`` at the end of a short text."""
    return PREFIX + "So the final answer is $\\boxed{" + answer + "}$."


def split_list(answer: str) -> list[str]:
    """Top-level comma-separated items of ``answer`` (commas inside brackets/braces do not split)."""
    items, depth, cur = [], 0, ""
    for ch in answer:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    return [i for i in items if i]


def _sub_nth(pattern: re.Pattern, text: str, fn, which: int = 0) -> str | None:
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    m = matches[which]
    return text[: m.start()] + fn(m) + text[m.end():]


def perturbations(gold: str, other: str) -> list[tuple[str, str]]:
    """``[(kind, answer)]`` of perturbed answers (duplicates and the gold itself removed)."""
    out: list[tuple[str, str]] = []
    first_digit = re.search(r"\d", gold)
    if first_digit:
        i = first_digit.start()
        out.append(("first_digit", gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1:]))
    else:
        out.append(("first_digit", other))
    out.append(("other_row", other))
    items = split_list(gold)
    if len(items) > 1:
        out.append(("list_reorder", ", ".join(reversed(items))))
        out.append(("list_merge", "".join(items)))
        out.append(("list_drop", ", ".join(items[:-1])))
        out.append(("list_merge", ",".join(items[:-1]) + items[-1]))
    if re.fullmatch(r"-?\d{2,}", gold):
        out.append(("list_split", gold[:1] + "," + gold[1:]))
        out.append(("list_split", gold[:-1] + ", " + gold[-1:]))
    if gold.count("=") == 1:
        lhs, rhs = (s.strip() for s in gold.split("="))
        out.append(("equation_lhs", f"{lhs}^2 = {rhs}"))
        lhs_digit = _sub_nth(_INT, lhs, lambda m: str(int(m.group()) + 1))
        out.append(("equation_lhs", f"{lhs_digit if lhs_digit is not None else lhs + '+1'} = {rhs}"))
        out.append(("equation_swap", f"{rhs} = {lhs}"))
        out.append(("equation_rhs", rhs))
    for which in (0, -1):
        bumped = _sub_nth(_INT, gold, lambda m: str(int(m.group()) + 1), which)
        if bumped:
            out.append(("off_by_one", bumped))
        lowered = _sub_nth(_INT, gold, lambda m: str(max(int(m.group()) - 1, 0)), which)
        if lowered:
            out.append(("off_by_one", lowered))
    shifted = _sub_nth(_NUMBER, gold, lambda m: m.group() + "0" if "." not in m.group() else m.group() + "1")
    if shifted:
        out.append(("digit_shift", shifted))
    shifted = _sub_nth(_INT, gold, lambda m: m.group()[:-1] + "." + m.group()[-1] if len(m.group()) > 1 else m.group())
    if shifted:
        out.append(("digit_shift", shifted))
    power = _sub_nth(_POWER, gold, lambda m: "^{" + str(int(m.group(1)) + 1) + "}")
    if power:
        out.append(("power", power))
        out.append(("power", _sub_nth(_POWER, gold, lambda m: "^{" + str(max(int(m.group(1)) - 1, 0)) + "}")))
    fact = _sub_nth(_FACTORIAL, gold, lambda m: str(int(m.group(1)) + 1) + "!")
    if fact:
        out.append(("factorial", fact))
        out.append(("factorial", _sub_nth(_FACTORIAL, gold, lambda m: str(int(m.group(1)) + 2) + "!")))
    if gold.startswith("-"):
        out.append(("sign", gold[1:]))
    else:
        out.append(("sign", "-" + gold))
        if len(items) > 1:
            out.append(("sign", ", ".join(["-" + items[0]] + items[1:])))
    out.append(("unit", gold + "\\text{ cm}"))
    out.append(("percent", gold + "\\%"))
    num = re.fullmatch(r"\d+(?:\.\d+)?", gold)
    if num:
        out.append(("percent", format_decimal(str(float(gold) * 100)) + "\\%"))
        out.append(("percent", format_decimal(str(float(gold) / 100))))
    decimal = re.search(r"\d\.(\d+)", gold)
    if decimal:
        end = decimal.end()
        out.append(("near_miss", gold[: end - 1] + str((int(gold[end - 1]) + 1) % 10) + gold[end:]))
        out.append(("near_miss", gold[:end] + "1" + gold[end:]))
    seen, unique = {gold.strip()}, []
    for kind, answer in out:
        if answer is not None and answer.strip() not in seen and answer.strip():
            seen.add(answer.strip())
            unique.append((kind, answer))
    return unique


def format_decimal(text: str) -> str:
    """``"25.0"`` → ``"25"``, ``"0.25"`` stays."""
    return text[:-2] if text.endswith(".0") else text


def variants(gold: str) -> list[str]:
    """The gold in an equivalent notation: integer ``n`` → ``n.0``, every ``\\frac`` → ``\\dfrac`` (may be empty)."""
    if re.fullmatch(r"-?\d+", gold):
        return [gold + ".0"]
    if "\\frac" in gold:
        return [gold.replace("\\frac", "\\dfrac")]
    return []


def forms(answer: str, dapo_line: bool) -> list[tuple[str, str]]:
    """``[(form, response)]``: ``answer`` in other answer forms (``\\fbox``, ``\\boxed x``, one box per list item,
    and with ``dapo_line`` DAPO's ``Answer:`` line, plain, in bold, and after a box)."""
    out = [("fbox", PREFIX + "Hence \\fbox{" + answer + "}.")]
    if "$" not in answer and "\n" not in answer and not answer.endswith("."):
        out.append(("boxed_space", PREFIX + "so our answer is $\\boxed " + answer + "$."))
    items = split_list(answer)
    thousands = re.fullmatch(r"-?\d{1,3}(?:,(?:\\!)?\d{3})+", answer.strip())  # 58,500 is one number
    if len(items) > 1 and not thousands and not any(("\\boxed" in i or "$" in i) for i in items):
        joined = ", ".join(f"$\\boxed{{{i}}}$" for i in items[:-1]) + f" and $\\boxed{{{items[-1]}}}$"
        out.append(("multi_box", PREFIX + "The solutions are " + joined + "."))
    if dapo_line:
        out.append(("line", PAD + "\nAnswer: " + answer))
        out.append(("line_bold_key", PAD + "\n**Answer:** " + answer))
        out.append(("line_bold_value", PAD + "\nAnswer: **" + answer + "**"))
        out.append(("box_then_line", PAD + "\\boxed{" + answer + "}.\n\n**Answer:** " + answer))
    return out


def cases(gold: str, other: str, dapo_line: bool = False) -> list[Case]:
    """Every :class:`Case` for one gold answer (module docstring).

    Args:
        gold: the gold answer.
        other: another row's gold (a different value), used when a perturbation needs one.
        dapo_line: also build DAPO ``Answer:`` line forms (the ``math_dapo`` route reads them).
    """
    out = [Case("gold", gold, box(gold))]
    out += [Case("variant", v, box(v)) for v in variants(gold)]
    out += [Case("form", gold, resp) for _, resp in forms(gold, dapo_line)]
    for kind, answer in perturbations(gold, other):
        out.append(Case(kind, answer, box(answer)))
        for form, resp in forms(answer, dapo_line):
            out.append(Case(f"{kind}@{form}", answer, resp))
    return out
