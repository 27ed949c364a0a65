"""Benchmark: the size a verl maintainer reads, against the limits the project set itself.

Prints, for a job that asks only for the S2T mask (``loss_mode=stapo``) on the verl of the ledger:

1. **Lines loaded**: a fresh interpreter without ``VERL_PLATFORM`` (as on a GPU node) runs ``import verl`` (the
   plugin's entry point) and imports the verl modules such a job imports (the worker, the v1 trainer and its replay
   buffer, the agent loop, ``main_ppo``, ``verl.utils.config``), which fire the plugin's post-import hooks, then runs
   the driver's start-up of a job with ``loss_mode=stapo`` (Hydra composes verl's ``ppo_trainer``, the plugin's
   ``validate_config`` wrapper, the policy-loss config built as every worker builds it); it counts the ``stapo_verl``
   modules in ``sys.modules`` and their source lines. The worker's ``init_model`` and ``train_batch`` of such a job
   import nothing more (the series' loss and pre-pass live in modules already loaded).
2. **Ledger entries and wrappers**: ``PATCHES`` of ``stapo_verl.integration.verl_0_9_1``; a wrapper is an entry whose
   action wraps, replaces or rebinds a verl symbol.
3. **PR sizes**: production ``.py`` lines added by PR A and PR B in the committed ``upstream/patches/``
   (``upstream/build_series.py --sizes``; ``scripts/check_upstream.sh`` checks they are what the sources build).

Last line: ``series_size lines=<n> ledger=<n> wrappers=<n> pr_a=<n> pr_b=<n> within_limits=<bool>``. Usage:
    python benchmarks/bench_series_size.py [--no-prs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the limits: lines a masked job loads, ledger entries, wrappers, PR A and PR B production lines
LIMITS = {"lines": 1500, "ledger": 10, "wrappers": 6, "pr_a": 110, "pr_b": 150}

PROBE = """
import importlib, json, sys
import verl  # noqa: F401
for name in ("verl.workers.engine_workers", "verl.trainer.ppo.v1.trainer_base", "verl.trainer.ppo.v1.replay_buffer",
             "verl.experimental.agent_loop.agent_loop", "verl.trainer.main_ppo", "verl.utils.config"):
    importlib.import_module(name)
# the driver's start-up of a job that asks for the mask alone: compose, validate (the plugin's wrapper), build the
# actor config as every worker does
from hydra import compose, initialize_config_module
from verl.utils.config import omega_conf_to_dataclass, validate_config
with initialize_config_module("verl.trainer.config", version_base=None):
    config = compose("ppo_trainer", overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=stapo"])
try:
    validate_config(config, use_reference_policy=False, use_critic=False)
except Exception:  # verl's own checks of the unset sizes; the plugin's part ran first
    pass
omega_conf_to_dataclass(config.actor_rollout_ref.actor.policy_loss)
from stapo_verl.integration.verl_0_9_1 import PATCHES
mods = {}
for m in sorted(n for n in sys.modules if n == "stapo_verl" or n.startswith("stapo_verl.")):
    f = getattr(sys.modules[m], "__file__", None)
    if f and f.endswith(".py"):
        with open(f, encoding="utf-8") as fh:
            mods[m] = sum(1 for _ in fh)
wrappers = [p.symbol for p in PATCHES if p.action.startswith(("wrapped", "replaced", "rebound"))]
print(json.dumps({"modules": mods, "ledger": len(PATCHES), "wrappers": wrappers}))
"""


def probe() -> dict:
    """The modules, ledger entries and wrappers of a fresh interpreter (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_pr_sizes(table: str) -> dict[str, int]:
    """``{"pr_a": n, "pr_b": n}``: the production ``.py`` lines added by PR A and PR B in the first table of
    ``build_series.py --sizes``; -1 where a row is missing."""
    sizes = {}
    for key, label in (("pr_a", "PR A"), ("pr_b", "PR B")):
        m = re.search(rf"^\| \d+ {label} [^|]*\| \+(\d+) / −\d+ \|", table, flags=re.M)
        sizes[key] = int(m.group(1)) if m else -1
    return sizes


def pr_sizes() -> dict[str, int]:
    """:func:`parse_pr_sizes` of ``build_series.py --sizes`` (the committed patches)."""
    out = subprocess.run([sys.executable, str(ROOT / "upstream" / "build_series.py"), "--sizes"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return parse_pr_sizes(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-prs", action="store_true", help="skip the PR sizes")
    args = parser.parse_args(argv)
    p = probe()
    got = {"lines": sum(p["modules"].values()), "ledger": p["ledger"], "wrappers": len(p["wrappers"])}
    if not args.no_prs:
        got.update(pr_sizes())
    print("| module | lines |\n|---|---|")
    for m, n in sorted(p["modules"].items(), key=lambda kv: -kv[1]):
        print(f"| `{m}` | {n} |")
    print("\nwrappers: " + ", ".join(p["wrappers"]))
    print("\n| measure | now | limit | within |\n|---|---|---|---|")
    for key, value in got.items():
        print(f"| {key} | {value} | {LIMITS[key]} | {'yes' if 0 <= value <= LIMITS[key] else 'no'} |")
    within = all(0 <= v <= LIMITS[k] for k, v in got.items())
    print("series_size " + " ".join(f"{k}={v}" for k, v in got.items()) + f" within_limits={within}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
