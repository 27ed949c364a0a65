"""``stats_source=current_minibatch`` (paper Algorithm 1 statistics) and the token dump, on verl's real
``TrainingWorker`` with the FSDP2 engine on the CPU platform (``current_minibatch_job.py``, fresh interpreter).

The job runs the v1 trainer's worker calls: the old-log-prob ``infer_batch`` pass, then ``train_mini_batch`` over
4 optimizer mini-batches at a large learning rate (so the current policy moves away from π_old between them).
The checks are shared with the Megatron engine's run of the same job (``support.current_minibatch_checks``).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.current_minibatch_checks import check_current_route, check_exact_renormalisation
from support.procs import child_env, free_port

from stapo_verl.integration.verl_0_9_1.policy_loss.config import (
    StapoConfigError,
    stapo_target,
)
from stapo_verl.integration.verl_0_9_1.policy_loss.checks import validate_token_mask_config
from stapo_verl.minibatch.dump_schema import SCHEMA

CAP = 12


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cm")
    out, dump = tmp / "report.json", tmp / "dump"
    env = child_env(VERL_PLATFORM="cpu")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("current_minibatch_job.py")), str(out),
                           "--port", str(free_port()), "--stats-source", "current_minibatch", "--dump-dir", str(dump),
                           "--cap", str(CAP)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), dump


def test_first_minibatch_equals_old_policy_later_ones_use_the_current_policy(run):
    check_current_route(run[0])


def test_exact_renormalisation_pg_denominator_is_valid_minus_masked(run):
    check_exact_renormalisation(run[0])


def test_token_dump_rows_follow_the_schema_and_the_cap(run):
    r, dump = run
    rows = [json.loads(line) for line in (dump / "stapo_tokens.dp0.jsonl").read_text().splitlines()]
    assert rows and all(tuple(row) == SCHEMA for row in rows)
    assert {row["step"] for row in rows} == {3}  # the batch's global_steps field
    assert len(rows) <= CAP
    by_mb = {}
    for row in rows:
        by_mb.setdefault(row["minibatch"], []).append(row)
        assert row["token"] == f"w{row['token_id']}" and f"⟦{row['token']}⟧" in row["context"]
        assert 0 < row["p"] < row["tau_p"] == 0.03 and row["advantage"] > 0  # every dumped row is a candidate
        assert row["kind"] in ("silenced", "kept") and row["loss_mode"] == "stapo"
        assert row["stats_source"] == "current_minibatch" and row["dp_rank"] == 0
        if row["kind"] == "silenced":
            assert row["entropy"] < row["tau_h"]
        else:
            assert row["entropy"] >= row["tau_h"]
    # silenced rows first, then as many kept candidates, within the per-step budget
    budget = CAP
    for j in sorted(by_mb):
        sil = sum(x["kind"] == "silenced" for x in by_mb[j])
        kept = len(by_mb[j]) - sil
        assert sil == min(r["n_masked"][j], budget)
        assert kept <= sil and kept <= budget - sil
        budget -= sil + kept
    assert sum(x["kind"] == "kept" for x in rows) > 0


def _cfg(**over):
    from omegaconf import OmegaConf

    c = {"trainer": {"use_v1": True}, "algorithm": {"rollout_correction": {"bypass_mode": False}},
         "data": {"train_batch_size": 16},
         "actor_rollout_ref": {"actor": {"calculate_entropy": False, "entropy_coeff": 0.0, "ppo_mini_batch_size": 4,
                                         "ppo_epochs": 1,
                                         "policy_loss": {"_target_": stapo_target(), "loss_mode": "stapo",
                                                         "stats_source": "current_minibatch"}}}}
    cfg = OmegaConf.create(c)
    for k, v in over.items():
        OmegaConf.update(cfg, k, v)
    return cfg


def test_cross_key_checks_current_minibatch_needs_the_old_log_prob_pass_not_calculate_entropy():
    validate_token_mask_config(_cfg())  # no actor.calculate_entropy needed: the extra forward asks for it itself
    with pytest.raises(StapoConfigError, match="v1 trainer: set trainer.use_v1=True"):
        validate_token_mask_config(_cfg(**{"trainer.use_v1": False}))
    with pytest.raises(StapoConfigError, match="bypass_mode=True skips"):
        validate_token_mask_config(_cfg(**{"algorithm.rollout_correction.bypass_mode": True}))
    validate_token_mask_config(_cfg(**{"actor_rollout_ref.actor.strategy": "megatron",
                                       "actor_rollout_ref.actor.megatron": {"pipeline_model_parallel_size": 1}}))
    with pytest.raises(StapoConfigError, match="megatron.pipeline_model_parallel_size=2"):
        validate_token_mask_config(_cfg(**{"actor_rollout_ref.actor.strategy": "megatron",
                                           "actor_rollout_ref.actor.megatron": {"pipeline_model_parallel_size": 2}}))
    with pytest.raises(StapoConfigError, match="distillation"):
        validate_token_mask_config(_cfg(**{"distillation": {"enabled": True}}))
