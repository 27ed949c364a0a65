"""Benchmark: what a GPU job pays for the plugin installed in its image, when it does not ask for it.

Three numbers:

1. **What ``import verl`` loads.** A fresh interpreter without ``VERL_PLATFORM`` (as on a GPU node) runs
   ``import verl`` with the plugin's entry point, and counts the ``stapo_verl`` modules in ``sys.modules`` and
   their source lines; the same with verl's plugin loading off (``VERL_USE_EXTERNAL_PLUGINS=none``) loads none.
2. **The wrappers installed** once the job's verl modules are imported (the worker, the trainer, the agent loop,
   ``main_ppo``): every symbol of the ledger carrying the plugin's mark, resolved on the live objects.
3. **One ``train_batch`` of a job that does not ask** (verl's vanilla loss, no token mask, no
   ``trainer.reproducible``): verl's real ``TrainingWorker`` with the FSDP2 engine on the CPU platform (a 0.4 M
   parameter Qwen3, 8 sequences of 4 + 6 tokens), with the integration installed (the entry point) and not
   installed (plugins off, the CPU platform registered by hand: the CPU platform in both). Each sample is a fresh
   subprocess running one variant (``--warmup`` calls, then ``--repeats`` timed calls; its time is their median);
   samples are interleaved in ``--pairs`` pairs, the order alternating, and each pair gives one ratio
   installed / not installed. Reported: the median ratio and its interquartile range, and the per-call difference.

Last line: ``plugin_cost modules=<n> lines=<n> wrappers=<n> train_batch_ratio=<median>``. Usage:
    python benchmarks/bench_plugin_cost.py [--pairs 6] [--repeats 20] [--warmup 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORT_PROBE = """
import json, sys
import verl  # noqa: F401
mods = sorted(m for m in sys.modules if m == "stapo_verl" or m.startswith("stapo_verl."))
lines = 0
for m in mods:
    f = getattr(sys.modules[m], "__file__", None)
    if f and f.endswith(".py"):
        with open(f, encoding="utf-8") as fh:
            lines += sum(1 for _ in fh)
print(json.dumps({"modules": mods, "lines": lines}))
"""

WRAPPER_PROBE = """
import importlib, json
import verl  # noqa: F401
for name in ("verl.workers.engine_workers", "verl.trainer.ppo.v1.trainer_base", "verl.trainer.ppo.v1.replay_buffer",
             "verl.experimental.agent_loop.agent_loop", "verl.trainer.main_ppo", "verl.utils.config"):
    importlib.import_module(name)
from stapo_verl.integration.verl_0_9_1 import PATCHES

def resolve(symbol):
    parts = symbol.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj

marked = [p.symbol for p in PATCHES if getattr(resolve(p.symbol), "__stapo_integration__", False)]
print(json.dumps({"wrappers": marked, "entries": len(PATCHES)}))
"""

TRAIN_PROBE = r"""
import json, os, statistics, sys, tempfile, time
installed = sys.argv[1] == "installed"
warmup, repeats = int(sys.argv[2]), int(sys.argv[3])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[4], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ["VERL_PLATFORM"] = "cpu"
if not installed:
    os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
import torch
import torch.distributed as dist
import verl  # noqa: F401
if not installed:
    from stapo_verl.cpu import register
    register()
import functools
sys.path.insert(0, os.path.join(sys.argv[5], "tests"))
from support.tiny_qwen3 import VOCAB, tiny_qwen3
from support.verl_batches import actor_config, tq_layout_batch
from verl.trainer.config import CheckpointConfig
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
import verl.workers.engine_workers as engine_workers
from verl.workers.engine_workers import TrainingWorker

marked = bool(getattr(TrainingWorker.train_batch, "__stapo_integration__", False))
assert marked == installed, (marked, installed)
torch.set_num_threads(1)
dist.init_process_group("gloo")
model_dir = tempfile.mkdtemp()
tiny_qwen3(seed=0, vocab=VOCAB).save_pretrained(model_dir)
model_cfg = HFModelConfig(path=model_dir, load_tokenizer=False, override_config={"attn_implementation": "sdpa"},
                          enable_gradient_checkpointing=False, use_remove_padding=True)
engine_cfg = FSDPEngineConfig(strategy="fsdp2", param_offload=False, optimizer_offload=False, use_torch_compile=False,
                              model_dtype="fp32", micro_batch_size_per_gpu=2, infer_micro_batch_size_per_gpu=4,
                              max_token_len_per_gpu=4096, infer_max_token_len_per_gpu=4096,
                              mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
worker = TrainingWorker(TrainingWorkerConfig(
    model_type="language_model", model_config=model_cfg, engine_config=engine_cfg,
    optimizer_config=FSDPOptimizerConfig(lr=1e-3, lr_warmup_steps=0, weight_decay=0.0, total_training_steps=10**6),
    checkpoint_config=CheckpointConfig()))
worker.reset()
worker.set_loss_fn(functools.partial(engine_workers.ppo_loss, config=actor_config("vanilla")))
g = torch.Generator().manual_seed(1)
bs, P, R = 8, 4, 6
prompts = torch.randint(0, VOCAB, (bs, P), generator=g)
responses = torch.randint(0, VOCAB, (bs, R), generator=g)
attn = torch.ones(bs, P + R, dtype=torch.int64)

def batch():
    td = tq_layout_batch(prompts, responses, attn)
    td["old_log_probs"] = torch.nested.as_nested_tensor([torch.full((R,), -2.0) for _ in range(bs)],
                                                        layout=torch.jagged)
    td["advantages"] = torch.nested.as_nested_tensor([torch.full((R,), 1.0 if i % 2 else -1.0) for i in range(bs)],
                                                     layout=torch.jagged)
    tu.assign_non_tensor(td, global_token_num=[P + R] * bs, update_lr_scheduler=False, temperature=1.0,
                         dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return td

times = []
for i in range(warmup + repeats):
    td = batch()
    t0 = time.perf_counter()
    worker.train_batch(td)
    if i >= warmup:
        times.append(time.perf_counter() - t0)
print(json.dumps({"median_s": statistics.median(times)}))
dist.destroy_process_group()
"""


def _python(code: str, *args: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise SystemExit(f"probe failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    plain = {"VERL_PLATFORM": ""}
    loaded = _python(IMPORT_PROBE, env=plain)
    off = _python(IMPORT_PROBE, env={**plain, "VERL_USE_EXTERNAL_PLUGINS": "none"})
    print(f"import verl (no VERL_PLATFORM): {len(loaded['modules'])} stapo_verl modules, {loaded['lines']} lines "
          f"(plugins off: {len(off['modules'])} modules)")
    for m in loaded["modules"]:
        print(f"  {m}")
    wrappers = _python(WRAPPER_PROBE, env=plain)
    print(f"wrappers installed once the job's verl modules are imported: {len(wrappers['wrappers'])} of "
          f"{wrappers['entries']} ledger entries")
    for w in wrappers["wrappers"]:
        print(f"  {w}")
    ratios, deltas, seconds = [], [], {"installed": [], "not_installed": []}
    for pair in range(args.pairs):
        order = ("installed", "not_installed") if pair % 2 == 0 else ("not_installed", "installed")
        got = {}
        for k, variant in enumerate(order):
            port = str(29500 + 2 * pair + k)
            got[variant] = _python(TRAIN_PROBE, "installed" if variant == "installed" else "off",
                                   str(args.warmup), str(args.repeats), port, str(ROOT))["median_s"]
            seconds[variant].append(got[variant])
        ratios.append(got["installed"] / got["not_installed"])
        deltas.append(got["installed"] - got["not_installed"])
        print(f"pair {pair + 1}/{args.pairs}: installed {got['installed'] * 1e3:.2f} ms, not installed "
              f"{got['not_installed'] * 1e3:.2f} ms, ratio {ratios[-1]:.3f}", flush=True)
    q1, med, q3 = _quartiles(ratios)
    d1, dmed, d3 = _quartiles(deltas)
    print(f"train_batch of a job that does not ask (FSDP2, CPU platform in both): installed / not installed = "
          f"{med:.3f} (IQR {q1:.3f}-{q3:.3f}, {args.pairs} pairs); per call {dmed * 1e3:+.2f} ms "
          f"(IQR {d1 * 1e3:+.2f} to {d3 * 1e3:+.2f}); medians {statistics.median(seconds['installed']) * 1e3:.2f} / "
          f"{statistics.median(seconds['not_installed']) * 1e3:.2f} ms")
    print(f"plugin_cost modules={len(loaded['modules'])} lines={loaded['lines']} wrappers={len(wrappers['wrappers'])} "
          f"train_batch_ratio={med:.3f}")


if __name__ == "__main__":
    main()
