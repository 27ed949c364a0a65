"""Running the tiny recipes from tests and reading what a run leaves in its run directory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.procs import REPO

from stapo_verl.diagnostics.reproducibility import reproducible  # noqa: F401  (re-exported for the e2e tests)

#: Hydra overrides that shrink the tiny run for tests: 8 prompts x 4 samples a step, 32 validation rows, n = 1.
SMALL = [
    "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4",
    "data.val_max_samples=32", "actor_rollout_ref.rollout.val_kwargs.n=1", "trainer.val_before_train=False",
]


def run_recipe(script: str, run_dir: Path, *overrides: str, timeout: int = 600,
               **env: str) -> subprocess.CompletedProcess:
    """``bash recipes/<script> <overrides>`` with ``STAPO_RUN_DIR=run_dir`` (and ``env``), output captured."""
    return subprocess.run(["bash", str(REPO / "recipes" / script), *overrides], cwd=REPO,
                          env={**os.environ, "STAPO_RUN_DIR": str(run_dir), **env},
                          capture_output=True, text=True, timeout=timeout)


def failure_text(run_dir: Path, proc: subprocess.CompletedProcess) -> str:
    """What to show when a run failed: the end of its train.log (or stdout) and of its stderr."""
    log = run_dir / "train.log"
    text = log.read_text(errors="replace") if log.exists() else proc.stdout
    return text[-6000:] + "\n--- stderr ---\n" + proc.stderr[-3000:]


def metrics_by_step(path: Path) -> dict[int, dict]:
    """verl's ``file`` logger JSONL (``{"step": n, "data": {...}}`` lines), merged per step."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.setdefault(rec["step"], {}).update(rec["data"])
    return out


def run_config(run_dir: Path):
    """The config ``main_ppo`` ran with: Hydra's ``.hydra/config.yaml`` (the recipes set ``hydra.run.dir``)."""
    from omegaconf import OmegaConf

    return OmegaConf.load(run_dir / "hydra" / ".hydra" / "config.yaml")


def check_denominator(m: dict) -> None:
    """The PG denominator of a step is Σ K = valid − silenced − non-finite (one mini-batch a step); without a
    candidate nothing is silenced and the token mean is verl's own (factor 1)."""
    if m["actor/stapo/num_candidates"] == 0:
        assert m["actor/stapo/num_masked"] == 0 and m["actor/stapo/renorm_factor"] == 1.0
        return
    n_valid = m["actor/stapo/num_candidates"] / m["actor/stapo/candidate_frac"]
    kept = n_valid - m["actor/stapo/num_masked"] - m["actor/stapo/nonfinite_tokens"]
    assert m["actor/policy_batch_num_tokens"] == pytest.approx(kept, abs=1e-6)
    assert m["actor/stapo/renorm_factor"] == pytest.approx(n_valid / kept)


#: the silenced tokens' share of the PG logit-gradient norm² (Theorem 3.1's lower bound, and its upper-bound twin)
GRAD_SHARE_KEYS = ("actor/stapo/silenced_grad_share", "actor/stapo/silenced_grad_share_upper")


def check_silenced_grad_share(m: dict) -> None:
    """One step's silenced-gradient shares: present, in [0, 1], 0 when nothing was silenced, and the upper-bound one
    > 0 when something was (a silenced token's exact norm² is ≥ w² (1 − p)² > 0; the lower bound may be clamped to
    0 at a silenced token with p near a large τ_p such as the e2e tests' 0.9)."""
    for key in GRAD_SHARE_KEYS:
        assert 0.0 <= m[key] <= 1.0, (key, m[key])
        if m["actor/stapo/num_masked"] == 0:
            assert m[key] == 0.0, (key, m[key])
    if m["actor/stapo/num_masked"] > 0:
        assert m["actor/stapo/silenced_grad_share_upper"] > 0.0


def check_mask_and_denominator(m: dict[int, dict]) -> None:
    """Every step's denominator (:func:`check_denominator`) and silenced-gradient shares
    (:func:`check_silenced_grad_share`), whatever the number of silenced tokens: whether a step silences any is a
    property of the trajectory, which differs by CPU type (the seeded warm start does), so it is not asserted."""
    for step in m:
        check_denominator(m[step])
        check_silenced_grad_share(m[step])


def recipe_process(script: str, run_dir: Path, *overrides: str, log: Path, **env: str) -> subprocess.Popen:
    """``bash recipes/<script>`` started in the background (its own session), output to ``log``."""
    f = open(log, "w")
    return subprocess.Popen(["bash", str(REPO / "recipes" / script), *overrides], cwd=REPO, stdout=f,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "STAPO_RUN_DIR": str(run_dir), **env})
