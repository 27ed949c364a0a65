"""Launch ``verl.trainer.main_ppo`` for a run directory, unless verl would train nothing.

Usage (what ``recipes/common/cpu.sh`` runs for the tiny CPU run)::

    python -m stapo_verl.launch.train --run-dir RUN [--command "bash recipes/tiny_cpu_stapo.sh"]
        [--stop-tokens MODEL OUT] -- <hydra overrides...>

In one process, so verl and the plugin are imported once:

1. Hydra composes the overrides with verl's config (:func:`stapo_verl.launch.compose.compose_config`) and
   :func:`stapo_verl.launch.resume.resume_state` reads verl's resume rule from it. When the checkpoint verl would
   resume from is already at the last step, it says so and exits with :data:`EXIT_COMPLETE` (nothing written).
2. It prints the line :func:`stapo_verl.launch.console.training_header` (the console reads the step range from
   it), writes the stop-token generation config (``--stop-tokens``, :func:`stapo_verl.launch.stop_tokens.
   write_generation_config`) and keeps an earlier ``RUN/metrics.jsonl`` as ``RUN/metrics.<unix time>.jsonl``
   (verl's ``file`` logger truncates its file, so ``metrics.jsonl`` then holds this invocation only).
3. It calls ``verl.trainer.main_ppo.main()`` (or ``$STAPO_MAIN_PPO``, ``module:function``) with the overrides as
   its command line: Hydra parses them again, exactly as ``python -m verl.trainer.main_ppo <overrides>`` would.

Exit status: main_ppo's (0 = trained); :data:`EXIT_COMPLETE` = already complete, nothing run; 2 = the overrides do
not compose (the message names the key).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from stapo_verl.launch.console import training_header
from stapo_verl.launch.resume import PREFIX, complete_message, resume_state

#: exit status when the run is already complete and nothing was run
EXIT_COMPLETE = 3
#: ``module:function`` called to train (a Hydra main reading ``sys.argv``); ``$STAPO_MAIN_PPO`` replaces it
#: (e.g. a recipe's own main_ppo, or a recorder in tests)
DEFAULT_ENTRY = "verl.trainer.main_ppo:main"
ENTRY_ENV = "STAPO_MAIN_PPO"


def keep_earlier_metrics(run_dir: str) -> str | None:
    """Rename ``run_dir/metrics.jsonl`` (when not empty) to ``metrics.<unix time>.jsonl``; return the new path."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    kept = os.path.join(run_dir, f"metrics.{int(time.time())}.jsonl")
    os.replace(path, kept)
    return kept


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m stapo_verl.launch.train", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True, help="the run directory (metrics.jsonl lives there)")
    ap.add_argument("--command", default="python -m verl.trainer.main_ppo ...",
                    help="the command the user ran (for messages)")
    ap.add_argument("--stop-tokens", nargs=2, metavar=("MODEL", "OUT"), default=None,
                    help="write MODEL's generation config with every stop id into OUT first")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    a = ap.parse_args(argv)
    from stapo_verl.launch.compose import compose_config

    try:
        state = resume_state(compose_config(a.overrides))
    except Exception as exc:  # noqa: BLE001  (Hydra / OmegaConf / ValueError: the message names the key)
        # one line (Hydra's messages span several: the reason and the "+key" hint would be hidden by the console)
        cause = f" (caused by {type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        text = " ".join(f"{type(exc).__name__}: {exc}{cause}".split())
        print(f"{PREFIX} ERROR: the overrides do not compose: {text}", file=sys.stderr)
        return 2
    if state.complete:
        print(complete_message(state, a.command, a.run_dir), file=sys.stderr, flush=True)
        return EXIT_COMPLETE
    print(training_header(a.run_dir, state.checkpoint_step or 0, state.total_steps), flush=True)
    if a.stop_tokens:
        from stapo_verl.launch import stop_tokens

        model, out = a.stop_tokens
        stop = stop_tokens.write_generation_config(model, out)
        print(f"[stapo stop tokens] {model}: stop at {stop.describe()} -> {out}", flush=True)
    keep_earlier_metrics(a.run_dir)
    sys.argv = ["verl.trainer.main_ppo", *a.overrides]
    module, _, function = os.environ.get(ENTRY_ENV, DEFAULT_ENTRY).partition(":")
    getattr(importlib.import_module(module), function)()  # @hydra.main parses sys.argv, exits non-zero on an error
    return 0


if __name__ == "__main__":
    sys.exit(main())
