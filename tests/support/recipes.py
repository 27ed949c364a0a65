"""Calling the recipe scripts from tests: a clean environment, and a stub venv that records the launches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.procs import REPO

#: The venv running the tests (the recipes' interpreter variable is STAPO_VENV).
VENV = str(Path(sys.executable).parent.parent)
#: Environment of every recipe subprocess: this venv's Python; no cluster or user setting leaks in.
BASE_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("SLURM_", "RAY_", "STAPO_REWARD_"))
    and k not in ("NNODES", "PRECISION", "MODEL_PATH", "EXP_NAME", "ENGINE", "PYTHON", "STAPO_RUN_DIR")
}
BASE_ENV.update({"STAPO_VENV": VENV, "HOME": os.environ.get("HOME", "/tmp"), "WANDB_MODE": "disabled"})
#: modules whose launches the stub venv records instead of running
STUBBED = ("verl.trainer.main_ppo", "stapo_verl.launch.dryrun", "stapo_verl.stop_tokens", "stapo_verl.plots",
           "stapo_verl.launch.preflight")
#: ``STAPO_MAIN_PPO`` value that makes ``python -m stapo_verl.launch.train`` record instead of training
RECORD_MAIN_PPO = "support.recipes:record_main_ppo"


def bash(args: list[str], env: dict[str, str] | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    """``bash <args>`` in the repository with :data:`BASE_ENV` plus ``env``; output captured as text."""
    return subprocess.run(["bash", *args], cwd=REPO, env={**BASE_ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def stub_venv(tmp_path: Path) -> Path:
    """A venv whose ``bin/python`` appends ``RAY_ADDRESS=…``, its argv and ``---`` to ``$STUB_OUT`` for
    ``-m <one of STUBBED>`` (exit 0, no output) and runs everything else with the real interpreter."""
    venv = tmp_path / "stub_venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    pattern = " | ".join(f'*" -m {m} "*' for m in STUBBED)
    py.write_text(
        "#!/usr/bin/env bash\n"
        'case " $* " in\n'
        f"{pattern})\n"
        '    { echo "RAY_ADDRESS=${RAY_ADDRESS:-}"; printf "%s\\n" "$@"; echo "---"; } >> "$STUB_OUT"; exit 0 ;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    py.chmod(0o755)
    return venv


def calls(path: Path) -> list[list[str]]:
    """The recorded stub calls: each is ``[RAY_ADDRESS=..., argv...]`` (argv[0] is ``-m``)."""
    out, cur = [], []
    for line in path.read_text().splitlines():
        if line == "---":
            out.append(cur)
            cur = []
        else:
            cur.append(line)
    return out


def module_calls(path: Path, module: str) -> list[list[str]]:
    """The recorded calls of ``python -m <module>``."""
    return [c for c in calls(path) if c[1:3] == ["-m", module]]


def record_main_ppo() -> None:
    """Stand-in for ``verl.trainer.main_ppo.main`` (``STAPO_MAIN_PPO``): records ``sys.argv`` in ``$STUB_OUT`` in the
    format of :func:`stub_venv`, as a call of ``-m verl.trainer.main_ppo``."""
    lines = [f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS', '')}", "-m", "verl.trainer.main_ppo", *sys.argv[1:], "---"]
    with open(os.environ["STUB_OUT"], "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.environ["STUB_OUT"] + ".env", "w", encoding="utf-8") as f:  # what Ray would start its raylet with
        f.write(f"RAY_worker_niceness={os.environ.get('RAY_worker_niceness', '<unset>')}\n")
