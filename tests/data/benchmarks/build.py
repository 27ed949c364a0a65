"""Regenerate the vendored benchmark data of this folder from the published files.

Usage (from the repository root)::

    python tests/data/benchmarks/build.py --src DIR

``DIR`` holds the original files under the same relative paths as here (``aime24/test.jsonl``,
``minerva_math/test.jsonl``, ``dapo_math_17k/dapo_math_17k.parquet``, ...), e.g. a checkout of the sources listed in
:data:`SOURCES`. Every original is checked against its published sha256 first; a mismatch is an error.

Writes, for every dataset folder:

* ``<folder>/<file>``: a slice of the original in its original format: the rows listed in :data:`SOURCES`
  (JSONL lines copied byte for byte; Parquet rows re-written with pyarrow, same schema), chosen to cover the
  answer formats the data-preparation tests need;
* ``<folder>/gold.jsonl``: one line per row of the *whole* original, a JSON array ``[source row, problem id,
  ground truth]``, where the ground truth is what ``python -m stapo_verl.data.prepare`` writes for that row
  (``stapo_verl.data.datasets.SPECS[name].extract``), without deduplication;
* ``README.md``: provenance (source repository, commit, path, licence), sha256 of each original and of each
  vendored file, and how each file was derived.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

#: Per dataset (``stapo_verl.data`` name): the original file and where it was published, and the rows sliced.
SOURCES: dict[str, dict] = {
    "aime24": {
        "path": "aime24/test.jsonl",
        "repo": "https://github.com/QwenLM/Qwen2.5-Math",
        "commit": "a45202bd16f1ec06f433442dc1152d0074773465",
        "repo_path": "evaluation/data/aime24/test.jsonl",
        "sha256": "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
        "licence": "MIT (Qwen2.5-Math `evaluation/LICENSE`); problems (c) MAA, solutions from the AoPS wiki",
        "rows": [0, 7, 14, 15, 23, 24],
        "why": "ids 60 (answer `204`), 67/75/83/84 (zero-padded answers `025`, `073`, `045`, `033`), 74",
    },
    "aime25": {
        "path": "aime25/test.jsonl",
        "repo": "https://github.com/inclusionAI/AReaL",
        "commit": "1b0306631b01becc329af59df560efb754be34af",
        "repo_path": "evaluation/data/aime25/test.jsonl",
        "sha256": "b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331",
        "licence": "Apache-2.0 (AReaL); problems (c) MAA",
        "rows": "all",
        "why": "all 30 rows (16 KB): integer answers stored as JSON ints",
    },
    "amc23": {
        "path": "amc23/test.jsonl",
        "repo": "https://github.com/QwenLM/Qwen2.5-Math",
        "commit": "a45202bd16f1ec06f433442dc1152d0074773465",
        "repo_path": "evaluation/data/amc23/test.jsonl",
        "sha256": "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4",
        "licence": "MIT (Qwen2.5-Math `evaluation/LICENSE`); problems (c) MAA",
        "rows": "all",
        "why": "all 40 rows (28 KB): answers stored as JSON floats (`27.0`, `-1.0`)",
    },
    "math500": {
        "path": "math500/test.jsonl",
        "repo": "https://github.com/hkust-nlp/simpleRL-reason",
        "commit": "cf1c7858bfc145a27aa733e75d930d34f0d318a6",
        "repo_path": "examples/simplelr_math_eval/data/math500/test.jsonl",
        "sha256": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
        "licence": "MIT (PRM800K, Hendrycks MATH, simpleRL-reason); identical to openai/prm800k "
                   "`prm800k/math_splits/test.jsonl`",
        "rows": list(range(40)),
        "why": "the first 40 rows: tuple, `\\text{}`, degrees, `x=5`, complex numbers, lists `1,-2` and `3, 5, 7`",
    },
    "minerva": {
        "path": "minerva_math/test.jsonl",
        "repo": "https://github.com/QwenLM/Qwen2.5-Math",
        "commit": "a45202bd16f1ec06f433442dc1152d0074773465",
        "repo_path": "evaluation/data/minerva_math/test.jsonl",
        "sha256": "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
        "licence": "MIT (Qwen2.5-Math `evaluation/LICENSE`); problems from MIT OpenCourseWare (usually CC BY-NC-SA)",
        "rows": list(range(20)),
        "why": "the first 20 rows: boxed answers `1.6`, `4.5e33`, decimals and expressions",
    },
    "olympiadbench": {
        "path": "olympiadbench/test.jsonl",
        "repo": "https://github.com/QwenLM/Qwen2.5-Math",
        "commit": "a45202bd16f1ec06f433442dc1152d0074773465",
        "repo_path": "evaluation/data/olympiadbench/test.jsonl",
        "sha256": "bb8c1e38a16ea9eacb77530315a674d883f267fbff79183effc53681b4fcc416",
        "licence": "Apache-2.0 (OpenBMB/OlympiadBench); harness copy MIT",
        "rows": list(range(10)) + [13, 31, 66, 76, 104, 138, 194, 316],
        "why": "the first 10 rows, and ids 1664 (`$69$,$84$`), 1760, 1938, 1970 (`$...$.`), 2099, 2254, 2349 "
               "(`$221,$8$`): answers with inner `$`; 2592 (unit `%`, tolerance `1e-1`)",
    },
    "gsm8k": {
        "path": "gsm8k/test.jsonl",
        "repo": "https://github.com/openai/grade-school-math",
        "commit": "3101c7d5072418e28b9008a6636bde82a006892c",
        "repo_path": "grade_school_math/data/test.jsonl",
        "sha256": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
        "licence": "MIT (openai/grade-school-math)",
        "rows": list(range(20)) + [146, 201],
        "why": "the first 20 rows, and rows 146 and 201 (`#### 1,450,000`-style thousands separators)",
    },
    "dapo-math-17k": {
        "path": "dapo_math_17k/dapo_math_17k.parquet",
        "repo": "https://github.com/MasterVito/SvS",
        "commit": "9fd8f35375b31b8632b52e715296c264a3ad4176",
        "repo_path": "data/dapo_math_17k.parquet",
        "sha256": "246ae23df97c9eae8126cb4da780e9a0a31d10110e16eed144bcecbf2132d535",
        "licence": "Apache-2.0 (SvS LICENSE; upstream BytedTsinghua-SIA/DAPO-Math-17k is Apache-2.0)",
        "rows": list(range(40)) + [179, 226, 234, 248, 261],
        "why": "the first 40 rows, and rows 179 (repeats row 35's problem with another answer), 226/261 and "
               "234/248 (repeated problems, same answer): SvS's de-duplicated re-export of DAPO-Math-17k, "
               "`data_source=DAPO-17k`, bare problem texts",
    },
}


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _slice(name: str, spec: dict, src: Path, dst: Path) -> int:
    """Write the slice of one original; returns the number of rows written."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".jsonl":
        lines = src.read_bytes().splitlines(keepends=True)
        rows = range(len(lines)) if spec["rows"] == "all" else spec["rows"]
        dst.write_bytes(b"".join(lines[i] for i in rows))
        return len(rows)
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    rows = range(table.num_rows) if spec["rows"] == "all" else spec["rows"]
    pq.write_table(table.take(list(rows)), dst)
    return len(rows)


def _gold(name: str, src: Path, dst: Path) -> int:
    """Write ``gold.jsonl`` for every row of the original; returns the number of rows."""
    sys.path.insert(0, str(REPO))
    from stapo_verl.data.datasets import get_spec
    from stapo_verl.data.readers import iter_records

    spec = get_spec(name)
    out = []
    for row, rec in iter_records(str(src)):
        _, answer, problem_id = spec.extract(rec, str(src), row)
        out.append(json.dumps([row, problem_id, answer], ensure_ascii=False))
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")
    return len(out)


def build(src_dir: Path) -> list[dict]:
    """Check every original, write slices and gold files; returns one record per dataset for the README.

    Raises:
        FileNotFoundError: an original is missing under ``src_dir``.
        ValueError: an original's sha256 differs from the published one.
    """
    records = []
    for name, spec in SOURCES.items():
        src = src_dir / spec["path"]
        if not src.is_file():
            raise FileNotFoundError(f"{src} not found (expected the original of {name!r} at DIR/{spec['path']})")
        digest = sha256(src)
        if digest != spec["sha256"]:
            raise ValueError(f"{src}: sha256 {digest} differs from the published {spec['sha256']}")
        dst = HERE / spec["path"]
        n_slice = _slice(name, spec, src, dst)
        gold = dst.parent / "gold.jsonl"
        n_gold = _gold(name, src, gold)
        records.append({"name": name, **spec, "slice_rows": n_slice, "gold_rows": n_gold,
                        "slice_sha256": sha256(dst), "gold_sha256": sha256(gold)})
    return records


def write_readme(records: list[dict]) -> Path:
    """Write ``README.md`` (provenance and checksums) from :func:`build`'s records."""
    lines = [
        "# Vendored benchmark data",
        "",
        "Small slices of the published benchmark files (for the data-preparation tests) and every row's gold answer",
        "(for the differential reward test), so that the tests need nothing outside this repository. Regenerate",
        "everything here with `python tests/data/benchmarks/build.py --src DIR`, where `DIR` holds the originals",
        "under the relative paths below; the script checks each original's sha256 first. This file is written by it.",
        "",
        "Per dataset folder:",
        "- the slice keeps the original's file name and format (JSONL lines copied byte for byte; the DAPO Parquet",
        "  rows re-written with pyarrow, same schema);",
        "- `gold.jsonl` has one line per row of the whole original, a JSON array `[source row, problem id, ground",
        "  truth]`, the ground truth being what `python -m stapo_verl.data.prepare` writes for that row (no",
        "  deduplication; DAPO-Math-17k: all 17,917 rows).",
        "",
    ]
    for r in records:
        rows = "all rows" if r["rows"] == "all" else f"rows {r['rows']}"
        lines += [
            f"## {r['name']} (`{r['path']}`)",
            "",
            f"- source: {r['repo']}, commit `{r['commit']}`, path `{r['repo_path']}`",
            f"- licence: {r['licence']}",
            f"- original sha256: `{r['sha256']}`",
            f"- slice `{r['path']}`: {r['slice_rows']} rows ({rows}, 0-based); sha256 `{r['slice_sha256']}`",
            f"  - why these rows: {r['why']}",
            f"- `{Path(r['path']).parent}/gold.jsonl`: {r['gold_rows']} rows; sha256 `{r['gold_sha256']}`",
            "",
        ]
    path = HERE / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    manifest = {r["name"]: {"slice": r["path"], "slice_sha256": r["slice_sha256"],
                            "slice_source_rows": list(range(r["gold_rows"])) if r["rows"] == "all" else r["rows"],
                            "gold": str(Path(r["path"]).parent / "gold.jsonl"), "gold_sha256": r["gold_sha256"],
                            "gold_rows": r["gold_rows"], "original_sha256": r["sha256"]} for r in records}
    (HERE / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 when an original is missing or altered)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", required=True, type=Path, help="directory holding the original files")
    args = p.parse_args(argv)
    try:
        records = build(args.src)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_readme(records)
    for r in records:
        print(f"{r['name']}: slice {r['slice_rows']} rows, gold {r['gold_rows']} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
