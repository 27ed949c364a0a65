"""Per-run benchmark summaries and the paper-style comparison table (the STAPO paper's layout; markdown + CSV).

Rows are runs, columns the six benchmarks (then any others, e.g. GSM8K, which are not in "Avg"), "Avg" (unweighted
mean of the six, as in the paper) and "Δ Avg vs <first run>" (relative gain in %). Cells are percentages with 2 decimals.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from stapo_verl.eval.metrics import K_BY_BENCHMARK, SIX_BENCHMARKS, avg_at_k, pass_at_k


def summarize_run(scored: Iterable[dict], k_by_benchmark: Mapping[str, int] = K_BY_BENCHMARK) -> dict[str, dict]:
    """Aggregate scored records of one run into per-benchmark metrics.

    Every problem uses its own sample count n: avg@k is the mean of its n ≤ k samples, and pass@k uses
    ``pass_at_k(n, c, min(k, n))`` (a problem with fewer than k samples cannot give pass@k; it gives pass@n and is
    listed in ``short_problem_n``, which :func:`short_problem_notes` turns into the table's note).

    Args:
        scored: records with ``benchmark``, ``problem_id``, ``sample_index`` and ``acc`` (bool); ``timeout`` optional.
        k_by_benchmark: samples per problem; only samples with ``sample_index < k`` are used.

    Returns:
        ``{benchmark: {"avg@k", "pass@k", "k", "problems", "samples", "timeouts", "short_problems",
        "short_problem_n"}}`` with metrics as fractions; ``short_problems`` counts the problems with n < k and
        ``short_problem_n`` maps their ``problem_id`` to n.

    Raises:
        ValueError: a repeated ``(benchmark, problem_id, sample_index)`` (read files with
            :func:`stapo_verl.eval.records.read_records`, whose error also names the file and line).
    """
    grouped: dict[str, dict[str, dict[int, bool]]] = defaultdict(lambda: defaultdict(dict))
    timeouts: dict[str, int] = defaultdict(int)
    for r in scored:
        bench, pid, index = str(r["benchmark"]), str(r["problem_id"]), int(r["sample_index"])
        k = k_by_benchmark.get(bench, 1)
        if index >= k:
            continue
        if index in grouped[bench][pid]:
            raise ValueError(f"duplicate record (benchmark, problem_id, sample_index) = {(bench, pid, index)}")
        grouped[bench][pid][index] = bool(r["acc"])
        timeouts[bench] += int(bool(r.get("timeout", False)))
    out = {}
    for bench, problems in grouped.items():
        k = k_by_benchmark.get(bench, 1)
        samples = [list(s.values()) for s in problems.values()]
        short = {pid: len(s) for pid, s in problems.items() if len(s) < k}
        pass_k = sum(pass_at_k(len(s), sum(s), min(k, len(s))) for s in samples) / len(samples)
        out[bench] = {
            "avg@k": avg_at_k(samples),
            "pass@k": pass_k,
            "k": k,
            "problems": len(samples),
            "samples": sum(len(s) for s in samples),
            "timeouts": timeouts[bench],
            "short_problems": len(short),
            "short_problem_n": short,
        }
    return out


def short_problem_notes(runs: Mapping[str, Mapping[str, dict]]) -> list[str]:
    """One line per (run, benchmark) with problems that have fewer than k samples (their pass@k is pass@n).

    Args:
        runs: ``{run_name: summarize_run(...)}``.

    Returns:
        Lines such as ``"base / aime24: 1 of 30 problems with n < k = 32: '60' (n=31); their avg@k uses n samples
        and their pass@k is pass@n"``; empty when none.
    """
    lines = []
    for name, summary in runs.items():
        for bench, m in summary.items():
            short = m.get("short_problem_n") or {}
            if short:
                listed = ", ".join(f"{pid!r} (n={n})" for pid, n in sorted(short.items()))
                lines.append(f"{name} / {bench}: {len(short)} of {m['problems']} problems with n < k = {m['k']}: "
                             f"{listed}; their avg@k uses n samples and their pass@k is pass@n")
    return lines


def six_average(summary: Mapping[str, dict], metric: str = "avg@k") -> float | None:
    """Unweighted mean of ``metric`` over :data:`SIX_BENCHMARKS`; ``None`` if any of the six is missing."""
    if not all(b in summary for b in SIX_BENCHMARKS):
        return None
    return sum(summary[b][metric] for b in SIX_BENCHMARKS) / len(SIX_BENCHMARKS)


def build_table(runs: Mapping[str, Mapping[str, dict]], metric: str = "avg@k") -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table (values in %, 2 decimals; ``-`` where missing).

    Args:
        runs: ``{run_name: summarize_run(...)}`` in display order; the first run is the baseline for the gain.
        metric: ``"avg@k"`` or ``"pass@k"``.
    """
    names = list(runs)
    benches = [b for b in SIX_BENCHMARKS if any(b in runs[n] for n in names)]
    benches += sorted({b for n in names for b in runs[n]} - set(SIX_BENCHMARKS))
    base = six_average(runs[names[0]], metric) if names else None
    header = ["run"] + [f"{b} ({metric.replace('k', str(K_BY_BENCHMARK.get(b, 1)))})" for b in benches]
    header += ["Avg (6)", f"Δ Avg vs {names[0]} (%)" if names else "Δ Avg (%)"]
    rows = []
    for n in names:
        summ = runs[n]
        cells = [n] + [f"{100 * summ[b][metric]:.2f}" if b in summ else "-" for b in benches]
        avg = six_average(summ, metric)
        cells.append("-" if avg is None else f"{100 * avg:.2f}")
        cells.append("-" if avg is None or not base else f"{100 * (avg - base) / base:+.2f}")
        rows.append(cells)
    return header, rows


def build_gain_table(runs: Mapping[str, Mapping[str, dict]], metric: str = "avg@k") -> tuple[list[str], list[list[str]]]:
    """Relative gain (%) of every run after the first over the first run, per benchmark and for "Avg (6)".

    Cells are ``100 * (x − base) / base`` with a sign, ``-`` where either value is missing or the base is 0.
    """
    names = list(runs)
    header, _ = build_table(runs, metric)
    benches = [h.split(" (")[0] for h in header[1:-2]]
    rows = []
    base = runs[names[0]] if names else {}
    for n in names[1:]:
        cells = [n]
        for b in benches:
            x, y = runs[n].get(b, {}).get(metric), base.get(b, {}).get(metric)
            cells.append("-" if x is None or not y else f"{100 * (x - y) / y:+.2f}")
        x, y = six_average(runs[n], metric), six_average(base, metric)
        cells.append("-" if x is None or not y else f"{100 * (x - y) / y:+.2f}")
        rows.append(cells)
    return ["run"] + benches + ["Avg (6)"], rows


def to_markdown(header: list[str], rows: list[list[str]]) -> str:
    """GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_tables(runs: Mapping[str, Mapping[str, dict]], out_dir: str | Path) -> dict[str, Path]:
    """Write ``table.md`` (avg@k and pass@k tables, with relative-gain tables, and the note of
    :func:`short_problem_notes`) and ``table.csv``/``table_pass.csv``; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    md = []
    for metric, csv_name in (("avg@k", "table.csv"), ("pass@k", "table_pass.csv")):
        header, rows = build_table(runs, metric)
        md.append(f"### {metric}\n\n" + to_markdown(header, rows))
        if len(runs) > 1:
            gain_header, gain_rows = build_gain_table(runs, metric)
            md.append(f"### {metric}: relative gain vs {next(iter(runs))} (%)\n\n" + to_markdown(gain_header, gain_rows))
        with (out_dir / csv_name).open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows)
        paths[csv_name] = out_dir / csv_name
    notes = short_problem_notes(runs)
    if notes:
        md.append("### Problems with fewer than k samples\n\n" + "".join(f"- {line}\n" for line in notes))
    (out_dir / "table.md").write_text("\n".join(md), encoding="utf-8")
    paths["table.md"] = out_dir / "table.md"
    return paths
