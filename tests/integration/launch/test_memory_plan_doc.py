"""docs/recipes.md §3's memory table is the memory plan of the recipes' composed configs, and ``--dry-run`` of the
8B recipe prints the plan, with ``stats_source=current_minibatch`` under 80 GB."""

from __future__ import annotations

import re

from stapo_verl.launch.compose import compose_config
from stapo_verl.launch.memory_plan import DEFAULT_GPU_GB, markdown_table, plan_for_config
from support.procs import REPO
from support.recipes import bash

CURRENT = "actor_rollout_ref.actor.policy_loss.stats_source=current_minibatch"
COLUMNS = (("1.7b", "1.7B (TP1, no offload)"), ("8b", "8B (TP2, offload)"), ("14b", "14B (TP4, offload)"))


def _plan(size: str, *extra: str):
    proc = bash(["recipes/run.sh", size, "stapo", "--print-overrides"])
    assert proc.returncode == 0, proc.stderr
    plan, why = plan_for_config(compose_config(proc.stdout.split() + list(extra)))
    assert plan is not None, why
    return plan


def test_the_docs_memory_table_is_the_plan():
    table = markdown_table({title: _plan(size, CURRENT) for size, title in COLUMNS})
    doc = (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- memory-plan:begin -->\n(.*?)\n<!-- memory-plan:end -->", doc, re.S)
    assert block is not None and block.group(1) == table


def test_the_8b_dry_run_prints_the_plan_and_current_minibatch_fits():
    for extra in ([], [CURRENT]):
        proc = bash(["recipes/qwen3_8b_stapo.sh", "--dry-run", *extra], timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "PASS  memory plan (per GPU and phase): peak actor update 62.9 of 80 GB" in proc.stdout
        assert ("  current-policy forward at 32768 tokens: 62.3 GB" in proc.stdout) == bool(extra)
    plan = _plan("8b", CURRENT)
    assert plan.fits and plan.phase("current-policy forward").total_gb < DEFAULT_GPU_GB
