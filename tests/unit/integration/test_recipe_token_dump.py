"""The tiny recipe turns the silenced-token dump on for S2T masks only: ``stapo_token_mask`` in recipes/common/base.sh
reads the run's mask from the method and the user's trailing ``token_mask`` override, and the recipe's list of S2T
masks is the plugin's. (The run itself, with a mask of the user's: ``tests/e2e/test_own_mask_from_docs.py``.)"""

from __future__ import annotations

import subprocess

import pytest
from support.procs import REPO

from stapo_verl.core.masks import S2T_TOKEN_MASKS

BASE = REPO / "recipes" / "common" / "base.sh"
KEY = "actor_rollout_ref.actor.policy_loss.token_mask"


def _bash(script: str, *args: str) -> str:
    return subprocess.run(["bash", "-c", f"source {BASE}; {script}", "bash", *args], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def test_the_recipes_s2t_masks_are_the_plugins():
    assert tuple(_bash('echo "${STAPO_S2T_MASKS[@]}"').split()) == S2T_TOKEN_MASKS


@pytest.mark.parametrize("method, overrides, mask", [
    ("stapo", [], "s2t"),
    ("stapo_random", [], "s2t_random"),
    ("top_entropy", [], "top_entropy"),
    ("justrl", [], ""),
    ("stapo", [f"{KEY}=drop_rare"], "drop_rare"),
    ("stapo", [f"++{KEY}='s2t_full'"], "s2t_full"),
    ("stapo", [f"+{KEY}=drop_rare"], "drop_rare"),
    ("stapo", [f"+{KEY}=drop_rare", "trainer.total_training_steps=1", f"{KEY}=s2t_high_entropy"], "s2t_high_entropy"),
    ("stapo", [f"{KEY}=null"], ""),
    ("stapo", [f"{KEY}_x=drop_rare"], "s2t"),
])
def test_token_mask_of_the_run(method, overrides, mask):
    assert _bash('stapo_token_mask "$@"', method, *overrides) == mask

