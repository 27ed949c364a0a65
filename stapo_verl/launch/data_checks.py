"""The data files against what verl and the reward manager read, before Ray starts.

verl 0.9.1 reads a data file only inside the TaskRunner (``verl.utils.dataset.rl_dataset.RLHFDataset``), after Ray,
and the reward manager reads its columns only at the first score, after the models and vLLM are up: a missing
``reward_model`` column then shows as one ``KeyError`` per response. These checks read the parquet footer (schema),
then only the columns they need:

* :func:`check_schema`: the prompt column (``data.prompt_key``: a list of ``{role, content}`` messages, what
  ``RLHFDataset._build_messages`` and the chat template take), ``reward_model`` with ``ground_truth`` (what verl's
  reward managers read, ``verl.workers.reward_manager``: ``data_item.non_tensor_batch["reward_model"]["ground_truth"]``)
  and the ``data.reward_fn_key`` column (default ``data_source``), strings;
* :func:`check_routes`: with the project's scorer as the reward function (``pkg://stapo_verl.rewards``), every
  ``data_source`` value has a route (:func:`stapo_verl.rewards.routing.route_for`);
* :func:`check_rows`: every row holds what the scorer reads: a ground truth it can compare
  (:func:`stapo_verl.rewards.ground_truth.ground_truth_problem`: present, non-empty, a string or a finite number), a
  non-empty prompt and, with the project's scorer, a routed ``data_source``. verl would score the responses of a row
  without a ground truth −1, correct ones included, and say nothing; the refused rows are counted and named (file,
  row, field) with the fix, and ``python -m stapo_verl.launch.data_checks --drop-bad-rows IN OUT`` writes a copy
  without them when the user asks for that (:func:`drop_bad_rows`);
* :func:`check_prompt_lengths`: prompt tokens (the chat template with ``add_generation_prompt=True``, as
  ``RLHFDataset``'s filter counts them) against ``data.max_prompt_length``. verl's agent loop left-truncates a longer
  prompt with a log warning (``AgentLoopBase._cap_text_prompt_length``) whatever ``data.truncation`` says, so a longer
  prompt is: dropped by verl (``data.filter_overlong_prompts=True``, reported), truncated because the config asks for
  it (``data.truncation=left``, reported), or refused here (anything else).

Each raises :class:`DataCheckError` naming the file, the column or value, what is needed and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stapo_verl.launch.compose import data_files

#: verl's reward function path that routes through the project's scorer
PROJECT_SCORER = "pkg://stapo_verl.rewards"
#: how many offending values / rows a message lists
SHOW = 5


class DataCheckError(ValueError):
    """A data file does not hold what verl or the reward manager will read; the message names the file, the
    column or value, what is needed and the fix."""


@dataclass(frozen=True)
class DataReport:
    """What :func:`check_data` found: one line for the console, lines to print as warnings, and ``PASS`` or
    ``SKIPPED`` (no data file is on this machine)."""

    detail: str
    warnings: tuple[str, ...] = ()
    status: str = "PASS"


def _fix_prepare() -> str:
    return ("write the file with `python -m stapo_verl.data.prepare` (docs/data_rewards_eval.md), or give verl's RL "
            "parquet layout: data_source (string), prompt (list of {role, content}), reward_model {ground_truth}")


def check_schema(path: str, prompt_key: str = "prompt", source_key: str = "data_source") -> None:
    """The columns verl and the reward manager read, with their types (the parquet footer only).

    Args:
        path: a parquet file.
        prompt_key: ``data.prompt_key``.
        source_key: ``data.reward_fn_key``.

    Raises:
        DataCheckError: a column is absent or of another type (naming it, the type found and the type needed).
        OSError: the file cannot be read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    names = set(schema.names)
    need = [c for c in (prompt_key, "reward_model", source_key) if c not in names]
    if need:
        raise DataCheckError(
            f"{path} has no column {', '.join(repr(c) for c in need)} (columns: {sorted(names)}); verl's dataset "
            f"(data.prompt_key={prompt_key!r}) and reward manager (data.reward_fn_key={source_key!r}, "
            f"reward_model.ground_truth) read them at the first step: {_fix_prepare()}")
    rm = schema.field("reward_model").type
    if not pa.types.is_struct(rm) or rm.get_field_index("ground_truth") < 0:
        raise DataCheckError(
            f"{path}: column 'reward_model' is {rm}, needed a struct with a 'ground_truth' field (verl's reward "
            f"managers read reward_model['ground_truth']): {_fix_prepare()}")
    prompt = schema.field(prompt_key).type
    if not (pa.types.is_list(prompt) or pa.types.is_large_list(prompt)) or not pa.types.is_struct(prompt.value_type) \
            or {"role", "content"} - {f.name for f in prompt.value_type}:
        raise DataCheckError(
            f"{path}: column {prompt_key!r} is {prompt}, needed a list of {{role, content}} messages (verl applies "
            f"the chat template to it): {_fix_prepare()}")
    src = schema.field(source_key).type
    if not (pa.types.is_string(src) or pa.types.is_large_string(src)):
        raise DataCheckError(f"{path}: column {source_key!r} is {src}, needed a string (the reward function's "
                             f"data_source): {_fix_prepare()}")


def check_routes(path: str, source_key: str = "data_source") -> list[str]:
    """Every ``data_source`` of ``path`` has a route in the project's scorer (reads that column only).

    Returns:
        The distinct values, sorted.
    Raises:
        DataCheckError: naming the unrouted values, their row count and the routed ones.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from stapo_verl.rewards.routing import UnknownDataSourceError, route_for

    values = sorted(str(v) for v in pc.unique(pq.read_table(path, columns=[source_key])[source_key]).to_pylist())
    bad = []
    for value in values:
        try:
            route_for(value)
        except UnknownDataSourceError as exc:
            bad.append((value, exc))
    if bad:
        raise DataCheckError(
            f"{path}: {source_key}={[v for v, _ in bad][:SHOW]} has no scorer in {PROJECT_SCORER} ({bad[0][1]}); "
            "fix the column, or pass a scorer in reward.custom_reward_function.reward_kwargs")
    return values


def row_problems(path: str, prompt_key: str = "prompt", source_key: str = "data_source",
                 routed: bool = True) -> tuple[int, list[tuple[int, str, str]]]:
    """The rows of ``path`` the scorer cannot score (reads the prompt, ``reward_model`` and data-source columns).

    Args:
        path: a parquet file with the columns :func:`check_schema` checks.
        prompt_key, source_key: ``data.prompt_key``, ``data.reward_fn_key``.
        routed: also refuse a ``data_source`` the project's scorer has no route for.

    Returns:
        ``(rows, problems)``: the row count and ``(row index, field, what is wrong)`` per refused row (the first
        problem of each row), in row order.
    """
    import pyarrow.parquet as pq

    from stapo_verl.rewards.ground_truth import ground_truth_problem
    from stapo_verl.rewards.routing import UnknownDataSourceError, route_for

    table = pq.read_table(path, columns=[prompt_key, "reward_model", source_key])
    prompts, rms, sources = (table[c].to_pylist() for c in (prompt_key, "reward_model", source_key))
    problems = []
    for i, (prompt, rm, source) in enumerate(zip(prompts, rms, sources)):
        gt_problem = "is missing (no reward_model)" if rm is None else ground_truth_problem(rm.get("ground_truth"))
        if gt_problem is not None:
            gt = None if rm is None else rm.get("ground_truth")
            problems.append((i, "reward_model.ground_truth", f"{gt!r} {gt_problem}"))
        elif not prompt or not any(str((m or {}).get("content") or "").strip() for m in prompt):
            problems.append((i, prompt_key, "is empty (no message with content)"))
        elif routed:
            try:
                route_for(source)
            except UnknownDataSourceError:
                problems.append((i, source_key, f"{source!r} has no scorer in {PROJECT_SCORER}"))
    return table.num_rows, problems


def check_rows(path: str, prompt_key: str = "prompt", source_key: str = "data_source", routed: bool = True) -> int:
    """Every row of ``path`` can be scored (:func:`row_problems`).

    Returns:
        The row count.
    Raises:
        DataCheckError: naming the file, the count, the first :data:`SHOW` refused rows (row, field, value, what is
            wrong) and the two fixes (complete the rows; or drop them with ``--drop-bad-rows``).
    """
    rows, problems = row_problems(path, prompt_key, source_key, routed)
    if problems:
        named = "; ".join(f"row {i} {field} {what}" for i, field, what in problems[:SHOW])
        more = f" (and {len(problems) - SHOW} more)" if len(problems) > SHOW else ""
        stem = path[:-len(".parquet")] if path.endswith(".parquet") else path
        raise DataCheckError(
            f"{path}: {len(problems)} of {rows} rows cannot be scored: {named}{more}. verl would train on them and "
            f"score their responses as wrong answers, correct ones included. Fix: complete those rows (python -m "
            f"stapo_verl.data.prepare writes every field), or leave them out: python -m stapo_verl.launch.data_checks "
            f"--drop-bad-rows {path} {stem}.checked.parquet, and point data.train_files / data.val_files at that file")
    return rows


def drop_bad_rows(src: str, dst: str, prompt_key: str = "prompt", source_key: str = "data_source",
                  routed: bool = True) -> tuple[int, list[tuple[int, str, str]]]:
    """Write the rows of ``src`` that :func:`row_problems` accepts to ``dst`` (same schema and order).

    Returns:
        ``(rows kept, the rows left out with their problems)``.
    Raises:
        OSError: ``src`` cannot be read or ``dst`` written. DataCheckError: ``src`` fails :func:`check_schema`.
    """
    import pyarrow.parquet as pq

    check_schema(src, prompt_key, source_key)
    _rows, problems = row_problems(src, prompt_key, source_key, routed)
    table = pq.read_table(src)
    bad = {i for i, _, _ in problems}
    kept = table.take([i for i in range(table.num_rows) if i not in bad])
    pq.write_table(kept, dst)
    return kept.num_rows, problems


def prompt_lengths(path: str, count: Callable[[list], int], prompt_key: str = "prompt") -> list[int]:
    """Token count of every prompt of ``path`` (reads that column only); ``count(messages) -> int``."""
    import pyarrow.parquet as pq

    return [count(m) for m in pq.read_table(path, columns=[prompt_key])[prompt_key].to_pylist()]


def check_prompt_lengths(path: str, lengths: Iterable[int], max_len: int, filter_overlong: bool,
                         truncation: str) -> str | None:
    """Prompts longer than ``data.max_prompt_length``: filtered, truncated as asked, or refused.

    Args:
        path: the file (for the message).
        lengths: prompt token counts (:func:`prompt_lengths`).
        max_len: ``data.max_prompt_length``.
        filter_overlong: ``data.filter_overlong_prompts``.
        truncation: ``data.truncation``.

    Returns:
        None when every prompt fits, else the warning line (dropped by verl's filter, or left-truncated as asked).
    Raises:
        DataCheckError: some prompts are longer, verl's filter is off and the config does not ask for
            left-truncation (naming the count, the longest, the key and both fixes).
    """
    lengths = list(lengths)
    over = [n for n in lengths if n > max_len]
    if not over:
        return None
    what = (f"{path}: {len(over)} of {len(lengths)} prompts are longer than data.max_prompt_length={max_len} "
            f"tokens (longest {max(over)})")
    if filter_overlong:
        return f"{what}: verl's data.filter_overlong_prompts=True drops them"
    if truncation == "left":
        return f"{what}: verl keeps their last {max_len} tokens (data.truncation=left)"
    raise DataCheckError(
        f"{what}, and data.filter_overlong_prompts=False with data.truncation={truncation!r}: verl's agent loop would "
        f"keep only their last {max_len} tokens (it left-truncates whatever data.truncation says). Fix: "
        f"data.filter_overlong_prompts=True (drop them), data.max_prompt_length>={max(over)}, or "
        "data.truncation=left (truncate, as asked)")


def _token_counter(model_path: str, template_kwargs: dict) -> Callable[[list], int]:
    """``messages -> tokens`` as verl's filter counts them (``apply_chat_template(..., add_generation_prompt=True,
    tokenize=True)``); raises what ``AutoTokenizer.from_pretrained`` raises."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    kwargs = {k: v for k, v in template_kwargs.items() if k not in ("tokenize", "return_dict", "return_tensors")}

    def count(messages) -> int:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return len(ids)

    return count


def check_data(config, model_path: str | None = None) -> DataReport:
    """Every ``data.train_files`` / ``data.val_files`` present here: schema, routes, prompt lengths.

    Args:
        config: the composed trainer config.
        model_path: a local HF directory whose tokenizer counts the prompt tokens (None: lengths not checked).

    Returns:
        :class:`DataReport`; files absent here are listed in its detail, not checked.
    Raises:
        DataCheckError: as :func:`check_schema`, :func:`check_routes`, :func:`check_prompt_lengths`.
    """
    from omegaconf import OmegaConf

    data = config.data
    prompt_key, source_key = data.get("prompt_key", "prompt"), data.get("reward_fn_key", "data_source")
    files = data_files(data.get("train_files")) + data_files(data.get("val_files"))
    present = [f for f in files if os.path.isfile(os.path.expanduser(f))]
    ours = str(OmegaConf.select(config, "reward.custom_reward_function.path", default="") or "") == PROJECT_SCORER
    count = None
    if model_path is not None:
        count = _token_counter(model_path, dict(data.get("apply_chat_template_kwargs", None) or {}))
    if not present:
        return DataReport(f"none of the {len(files)} data files is on this machine: columns, data sources and prompt "
                          "lengths not checked", status="SKIPPED")
    warnings, sources = [], set()
    for f in present:
        path = os.path.expanduser(f)
        check_schema(path, prompt_key, source_key)
        if ours:
            sources.update(check_routes(path, source_key))
        check_rows(path, prompt_key, source_key, routed=ours)
        if count is not None:
            w = check_prompt_lengths(path, prompt_lengths(path, count, prompt_key), data.max_prompt_length,
                                     bool(data.get("filter_overlong_prompts", False)),
                                     str(data.get("truncation", "error")))
            warnings += [w] if w else []
    parts = [f"{len(present)}/{len(files)} data files here: columns {prompt_key}, reward_model.ground_truth, "
             f"{source_key} present; every row's ground truth and prompt present"]
    if ours:
        parts.append(f"data sources {sorted(sources)} routed by {PROJECT_SCORER}")
    parts.append(f"prompt lengths <= data.max_prompt_length={data.max_prompt_length} checked" if count
                 else "prompt lengths not checked (no local tokenizer)")
    if len(present) < len(files):
        parts.append(f"absent here: {[f for f in files if f not in present][:SHOW]}")
    return DataReport("; ".join(parts), tuple(warnings))


def main(argv: list[str] | None = None) -> int:
    """``python -m stapo_verl.launch.data_checks --drop-bad-rows IN OUT``: write IN's rows that can be scored to OUT
    and name the ones left out (:func:`drop_bad_rows`). Returns the exit status (2: IN is unreadable or lacks a
    column)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m stapo_verl.launch.data_checks",
                                 description="Write a copy of a data file without the rows the scorer cannot score.")
    ap.add_argument("--drop-bad-rows", nargs=2, metavar=("IN", "OUT"), required=True)
    ap.add_argument("--prompt-key", default="prompt", help="data.prompt_key (default prompt)")
    ap.add_argument("--source-key", default="data_source", help="data.reward_fn_key (default data_source)")
    ap.add_argument("--any-source", action="store_true",
                    help="keep rows whose data_source the project's scorer does not route (your own reward function)")
    a = ap.parse_args(argv)
    src, dst = a.drop_bad_rows
    try:
        kept, problems = drop_bad_rows(src, dst, a.prompt_key, a.source_key, routed=not a.any_source)
    except (DataCheckError, OSError) as exc:
        print(f"[stapo data] ERROR: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    for i, field, what in problems[:SHOW]:
        print(f"[stapo data] left out row {i}: {field} {what}")
    if len(problems) > SHOW:
        print(f"[stapo data] ... and {len(problems) - SHOW} more rows left out")
    print(f"[stapo data] {dst}: {kept} rows kept, {len(problems)} left out of {src}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
