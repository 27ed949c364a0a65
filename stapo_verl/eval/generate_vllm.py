"""Cluster-side generation: checkpoint + prepared parquet(s) → generations JSONL for ``python -m stapo_verl.eval``.

The STAPO paper's protocol (https://arxiv.org/abs/2602.15620): up to 20,480 new tokens, k = 32 samples for AIME24/AIME25/AMC23 and 4 for the others, at both
decoding settings — training-aligned T = 1.0 / top-p 1.0 (main table) and JustRL's T = 0.7 / top-p 0.9. One file per
setting: ``<out>/<tag>.jsonl`` with tags ``t1.0_p1.0`` and ``t0.7_p0.9``.

The chat template is applied with a generation prompt, the same way verl's ``RLHFDataset`` renders the
``prompt`` column during training. Generation stops at the model's EOS *and* at its chat template's end-of-turn token
(Qwen3 base models: ``<|endoftext|>`` and ``<|im_end|>``), both read from the checkpoint's own files by
:mod:`stapo_verl.stop_tokens` — the same ids the training recipes give verl's vLLM server. vLLM and transformers
are imported inside :func:`main` only, so argument parsing and the record builder are importable and tested without
a GPU.

Example::

    python -m stapo_verl.eval.generate_vllm --model /ckpt/global_step_3000/hf \\
        --data data/aime24.parquet data/math500.parquet --out gens/stapo_1p7b --tp 1
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from stapo_verl.eval.metrics import K_BY_BENCHMARK
from stapo_verl.eval.records import write_records
from stapo_verl.stop_tokens import StopTokens
from stapo_verl.stop_tokens import resolve as resolve_stop_tokens

#: (temperature, top_p) pairs of the paper: training-aligned, and JustRL's.
DECODING_SETTINGS = ((1.0, 1.0), (0.7, 0.9))
MAX_NEW_TOKENS = 20_480


def decoding_tag(temperature: float, top_p: float) -> str:
    """File tag of a decoding setting, e.g. ``t1.0_p1.0``."""
    return f"t{temperature:.1f}_p{top_p:.1f}"


def build_parser() -> argparse.ArgumentParser:
    """Argument parser (no vLLM needed)."""
    p = argparse.ArgumentParser(prog="stapo-generate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF checkpoint directory (e.g. verl's merged actor/huggingface)")
    p.add_argument("--data", nargs="+", required=True, help="prepared parquet(s) from stapo_verl.data.prepare")
    p.add_argument("--out", required=True, help="output directory for <tag>.jsonl")
    p.add_argument("--settings", nargs="+", default=[decoding_tag(*s) for s in DECODING_SETTINGS],
                   choices=[decoding_tag(*s) for s in DECODING_SETTINGS], help="decoding settings to run")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    p.add_argument("--n", type=int, default=None, help="override samples per problem (default: 32 or 4 per benchmark)")
    p.add_argument("--tp", type=int, default=1, help="vLLM tensor parallel size")
    p.add_argument("--max-model-len", type=int, default=1024 + MAX_NEW_TOKENS)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-problems", type=int, default=None, help="smoke tests: first N problems per parquet")
    return p


def sampling_stop_kwargs(stop: StopTokens) -> dict:
    """vLLM ``SamplingParams`` keyword arguments that stop at every id of ``stop`` (EOS and end of turn).

    ``stop_token_ids`` is added to the ids vLLM already takes from the tokenizer and the generation config.
    """
    return {"stop_token_ids": list(stop.ids)}


def make_records(rows: Sequence[dict], outputs: Sequence[Sequence[str]], tag: str, parquet: str) -> Iterator[dict]:
    """Generation records for prepared rows and their sampled responses.

    Args:
        rows: prepared parquet rows (``data_source``, ``reward_model``, ``extra_info``).
        outputs: ``outputs[i]`` = the response texts for ``rows[i]``, sample order kept.
        tag: decoding tag (:func:`decoding_tag`).
        parquet: source parquet path, recorded for traceability.

    Raises:
        ValueError: ``rows`` and ``outputs`` differ in length.
    """
    if len(rows) != len(outputs):
        raise ValueError(f"{len(rows)} rows but {len(outputs)} output lists")
    for row, texts in zip(rows, outputs):
        info = row["extra_info"]
        for j, text in enumerate(texts):
            yield {
                "benchmark": info["benchmark"],
                "data_source": row["data_source"],
                "problem_id": str(info["problem_id"]),
                "sample_index": j,
                "response": text,
                "ground_truth": row["reward_model"]["ground_truth"],
                "decoding": tag,
                "parquet": parquet,
            }


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs vLLM and a GPU
    """Generate with vLLM and write one JSONL per decoding setting."""
    args = build_parser().parse_args(argv)
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, tensor_parallel_size=args.tp, max_model_len=args.max_model_len,
              gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed)
    tokenizer = llm.get_tokenizer()
    stop = resolve_stop_tokens(args.model)
    print(f"stop at {stop.describe()}")
    datasets = []
    for path in args.data:
        rows = pq.read_table(path).to_pylist()[: args.max_problems]
        prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
        datasets.append((path, rows, prompts))
    for tag in args.settings:
        temperature, top_p = {decoding_tag(*s): s for s in DECODING_SETTINGS}[tag]
        records = []
        for path, rows, prompts in datasets:
            n = args.n or K_BY_BENCHMARK.get(rows[0]["extra_info"]["benchmark"], 4)
            params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=args.max_new_tokens,
                                    seed=args.seed, **sampling_stop_kwargs(stop))
            outs = llm.generate(prompts, params)
            records.extend(make_records(rows, [[o.text for o in out.outputs] for out in outs], tag, path))
        n_written = write_records(records, Path(args.out) / f"{tag}.jsonl")
        print(f"{tag}: wrote {n_written} generations to {Path(args.out) / f'{tag}.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
