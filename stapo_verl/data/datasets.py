"""Registry of supported datasets: where their published files live and how one record maps to a verl row.

Answer handling follows the published formats (documented per file in ``tests/data/benchmarks/README.md``): integer
answers are canonicalised (AIME24 ``"025"`` → ``"25"``, AMC23 ``27.0`` → ``"27"``, GSM8K ``2,125`` → ``"2125"``),
Minerva's answer is the last ``\\boxed{}`` of its solution, OlympiadBench's is ``final_answer[0]`` with its math
delimiters removed (:func:`clean_olympiad_answer`: ``$69$,$84$`` → ``69,84``), and DAPO-Math-17k loses DAPO's
"Answer:" instruction template (JustRL's boxed suffix replaces it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from types import MappingProxyType

from stapo_verl.data.errors import DataPrepError
from stapo_verl.rewards.extract import last_box

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """How to prepare one dataset.

    Attributes:
        name: CLI name (``--dataset``).
        data_source: value written to ``data_source``; routes to the scorer in :mod:`stapo_verl.rewards.routing`.
        split: value of ``extra_info.split``.
        local_files: candidate paths inside a ``--src`` directory (first match wins).
        hf_id: hub id for cluster use (documentation / default for ``--src hf``).
        extract: ``(record, file, row) -> (problem, answer, problem_id)``.
        dedup: drop repeated problems (DAPO-Math-17k).
    """

    name: str
    data_source: str
    split: str
    local_files: tuple[str, ...]
    hf_id: str
    extract: Callable[[dict, str, int], tuple[str, str, str]]
    dedup: bool = False


def _field(rec: dict, key: str, file: str, row: int):
    if key not in rec:
        raise DataPrepError(f"missing column {key!r} (columns: {sorted(rec)})", file=file, row=row)
    return rec[key]


def _text(rec: dict, key: str, file: str, row: int) -> str:
    value = _field(rec, key, file, row)
    if not isinstance(value, str) or not value.strip():
        raise DataPrepError(f"column {key!r} must be a non-empty string, got {value!r}", file=file, row=row)
    return value.strip()


def _integer_answer(value, file: str, row: int) -> str:
    """``"025"``/``25``/``27.0`` → ``"25"``/``"25"``/``"27"``; other values raise."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataPrepError("empty answer", file=file, row=row)
    try:
        number = float(str(value).replace(",", "").strip())
    except ValueError as exc:
        raise DataPrepError(f"answer {value!r} is not a number", file=file, row=row) from exc
    if not number.is_integer():
        raise DataPrepError(f"answer {value!r} is not a whole number", file=file, row=row)
    return str(int(number))


def _nonempty(answer: str, file: str, row: int) -> str:
    answer = str(answer).strip()
    if not answer:
        raise DataPrepError("empty answer", file=file, row=row)
    return answer


def _aime(rec, file, row):
    problem = _text(rec, "problem", file, row)
    return problem, _integer_answer(_field(rec, "answer", file, row), file, row), str(rec.get("id", row))


def _math500(rec, file, row):
    problem = _text(rec, "problem", file, row)
    answer = _nonempty(_field(rec, "answer", file, row), file, row)
    return problem, answer, str(rec.get("unique_id", row))


def _minerva(rec, file, row):
    problem = _text(rec, "problem", file, row)
    solution = _text(rec, "solution", file, row)
    box = last_box(solution)
    if box is None:
        raise DataPrepError("empty answer: no \\boxed{} in 'solution'", file=file, row=row)
    answer = _nonempty(box.content, file, row)
    return problem, answer, str(rec.get("idx", row))


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def clean_olympiad_answer(answer: str) -> str:
    """An OlympiadBench ``final_answer`` element without its math delimiters.

    The published answers wrap each value in ``$...$``; multi-answer rows wrap each value separately
    (``$69$,$84$``, ``$f(x)=x$,$f(x)=2-x$``, 21 of 675 rows), so stripping only the outer pair leaves ``69$,$84``,
    which no answer matches. Every unescaped ``$`` is removed (``\\$`` is kept) and so is a final sentence period
    (``$(-\\infty, 0) \\cup\\{1\\}$.``).

    Args:
        answer: e.g. ``"$69$,$84$"``.

    Returns:
        e.g. ``"69,84"`` (stripped; may be empty, which the caller rejects).
    """
    cleaned = _UNESCAPED_DOLLAR.sub("", answer).strip()
    if cleaned.endswith(".") and not cleaned.endswith("\\."):
        cleaned = cleaned[:-1].rstrip()
    return cleaned


def _olympiad(rec, file, row):
    problem = _text(rec, "question", file, row)
    finals = _field(rec, "final_answer", file, row)
    if isinstance(finals, str):
        finals = [finals]
    if not finals:
        raise DataPrepError("empty answer: 'final_answer' is empty", file=file, row=row)
    answer = clean_olympiad_answer(str(finals[0]))
    return problem, _nonempty(answer, file, row), str(rec.get("id", row))


def _gsm8k(rec, file, row):
    problem = _text(rec, "question", file, row)
    solution = _text(rec, "answer", file, row)
    match = re.search(r"####\s*(.+?)\s*$", solution)
    if match is None:
        raise DataPrepError("empty answer: no '#### <answer>' line in 'answer'", file=file, row=row)
    return problem, _nonempty(match.group(1).replace(",", ""), file, row), str(row)


def _dapo(rec, file, row):
    prompt = _field(rec, "prompt", file, row)
    if isinstance(prompt, str):  # open-r1 "Processed" export: bare problem string
        problem = prompt
    else:  # verl schema: list of chat messages (original BytedTsinghua file or the SvS copy)
        users = [m.get("content", "") for m in (prompt or []) if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise DataPrepError(f"'prompt' has no user message: {prompt!r:.200}", file=file, row=row)
        problem = users[-1]
    problem = problem.strip()
    if problem.startswith(DAPO_PREFIX.strip()):
        problem = problem[len(DAPO_PREFIX.strip()) :]
    if problem.endswith(DAPO_SUFFIX.strip()):
        problem = problem[: -len(DAPO_SUFFIX.strip())]
    problem = problem.strip()
    if not problem:
        raise DataPrepError("empty problem text", file=file, row=row)
    if isinstance(rec.get("reward_model"), dict) and "ground_truth" in rec["reward_model"]:
        answer = rec["reward_model"]["ground_truth"]
    elif "solution" in rec:
        answer = rec["solution"]
    else:
        raise DataPrepError("missing column 'reward_model.ground_truth' (or 'solution')", file=file, row=row)
    if answer is None:
        raise DataPrepError("empty answer", file=file, row=row)
    extra = rec.get("extra_info") or {}
    problem_id = str(extra.get("index", row)) if isinstance(extra, dict) else str(row)
    return problem, _nonempty(answer, file, row), problem_id


SPECS = MappingProxyType({
    s.name: s
    for s in [
        DatasetSpec("dapo-math-17k", "math_dapo", "train",
                    ("dapo_math_17k/dapo_math_17k.parquet", "dapo_math_17k.parquet", "dapo-math-17k.parquet"),
                    "BytedTsinghua-SIA/DAPO-Math-17k", _dapo, dedup=True),
        DatasetSpec("aime24", "aime24", "test", ("aime24/test.jsonl", "test.jsonl"), "HuggingFaceH4/aime_2024", _aime),
        DatasetSpec("aime25", "aime25", "test", ("aime25/test.jsonl", "test.jsonl"), "math-ai/aime25", _aime),
        DatasetSpec("amc23", "amc23", "test", ("amc23/test.jsonl", "test.jsonl"), "math-ai/amc23", _aime),
        DatasetSpec("math500", "math500", "test", ("math500/test.jsonl", "test.jsonl"), "HuggingFaceH4/MATH-500",
                    _math500),
        DatasetSpec("minerva", "minerva", "test", ("minerva_math/test.jsonl", "minerva/test.jsonl", "test.jsonl"),
                    "math-ai/minervamath", _minerva),
        DatasetSpec("olympiadbench", "olympiadbench", "test", ("olympiadbench/test.jsonl", "test.jsonl"),
                    "Hothan/OlympiadBench", _olympiad),
        DatasetSpec("gsm8k", "gsm8k", "test", ("gsm8k/test.jsonl", "test.jsonl"), "openai/gsm8k", _gsm8k),
    ]
})


def get_spec(name: str) -> DatasetSpec:
    """Spec for ``--dataset`` ``name``.

    Raises:
        DataPrepError: unknown name (the message lists the allowed names).
    """
    if name not in SPECS:
        raise DataPrepError(f"unknown dataset {name!r}; allowed: {sorted(SPECS)} or 'all'")
    return SPECS[name]
