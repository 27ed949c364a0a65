"""``stats_source=current_minibatch`` (paper Algorithm 1 statistics) and the token dump, on verl's real
``TrainingWorker`` with the FSDP2 engine on the CPU platform (``current_minibatch_job.py``, fresh interpreter).

The job runs the v1 trainer's worker calls: the old-log-prob ``infer_batch`` pass, then ``train_mini_batch`` over
4 optimizer mini-batches at a large learning rate (so the current policy moves away from π_old between them).
``check_current_route``/``check_exact_renormalisation`` are shared with the Megatron engine's run of the same job
(``test_megatron_engine_on_cpu.py``).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stapo_verl.token_dump import SCHEMA

CAP = 12


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cm")
    out, dump = tmp / "report.json", tmp / "dump"
    env = dict(os.environ, VERL_PLATFORM="cpu", TORCHDYNAMO_DISABLE="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("current_minibatch_job.py")), str(out),
                           "--port", str(_free_port()), "--stats-source", "current_minibatch", "--dump-dir", str(dump),
                           "--cap", str(CAP)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), dump


def check_current_route(r):
    """The job's report (``current_minibatch_job.py``, any engine): the first mini-batch uses π_old's statistics
    exactly, later ones the current policy's, which the training forward sees too. Shared with the Megatron test."""
    assert r["n_minibatches"] == 4 and r["ranks_agree"]
    # mini-batch 0: no optimizer step since the old-log-prob pass → the old values, the old_policy mask exactly
    assert r["uses_old"] == [True, False, False, False]
    assert r["equals_old_policy_mask"][0] and r["lp_shift"][0] == 0.0
    # later mini-batches: p comes from the current weights (moved by the earlier optimizer steps) and is what the
    # training forward of that mini-batch sees (kept tokens; one micro-batch per mini-batch)
    assert min(r["lp_shift"][1:]) > 1e-3
    assert max(r["mask_lp_vs_training_lp_maxdiff"]) < 1e-5
    assert not all(r["equals_old_policy_mask"][1:])  # the two sources disagree somewhere (constructed: lr 3e-2)
    m = r["metrics"]
    assert m["actor/stapo/current_stats"] == [0.0, 1.0, 1.0, 1.0]
    assert m["actor/stapo/mask_disagreement"][0] == 0.0 and sum(m["actor/stapo/mask_disagreement"][1:]) > 0
    assert [d > 0 for d in m["actor/stapo/mask_disagreement"][1:]] == [not e for e in r["equals_old_policy_mask"][1:]]
    # the reported disagreement counts exactly the valid tokens whose keep decision differs from the old_policy mask
    assert m["actor/stapo/mask_disagreement"] == [float(d) for d in r["disagreement_expected"]]
    assert m["actor/stapo/mask_disagreement_frac"] == pytest.approx(
        [d / v for d, v in zip(r["disagreement_expected"], r["n_valid"], strict=True)], rel=1e-12)


def check_exact_renormalisation(r):
    """PG denominator N_valid − N_masked per mini-batch; the engine's count stays N_valid. Shared with Megatron."""
    assert r["n_valid"] == r["n_valid_expected"]
    assert r["pg_batch_num_tokens"] == [float(v - k) for v, k in zip(r["n_valid"], r["n_masked"], strict=True)]
    assert r["engine_batch_num_tokens"] == [float(v) for v in r["n_valid"]]  # KL/entropy: all valid tokens
    assert r["metrics"]["actor/stapo/num_masked"] == [float(k) for k in r["n_masked"]]


def test_first_minibatch_is_old_policy_exactly_later_ones_use_the_current_policy(run):
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
                                         "policy_loss": {"_target_": "stapo_verl.config.StapoPolicyLossConfig",
                                                         "loss_mode": "stapo", "stats_source": "current_minibatch"}}}}
    cfg = OmegaConf.create(c)
    for k, v in over.items():
        OmegaConf.update(cfg, k, v)
    return cfg


def test_selfcheck_current_minibatch_needs_the_old_log_prob_pass_not_calculate_entropy():
    import stapo_verl.plugin  # noqa: F401  (registers the losses, as verl's entry point does in a real process)
    from stapo_verl.config import StapoConfigError
    from stapo_verl.selfcheck import validate_stapo_config

    validate_stapo_config(_cfg())  # no actor.calculate_entropy needed: the extra forward asks for it itself
    with pytest.raises(StapoConfigError, match="stats_source=current_minibatch .*trainer.use_v1=True"):
        validate_stapo_config(_cfg(**{"trainer.use_v1": False}))
    with pytest.raises(StapoConfigError, match="stats_source=current_minibatch needs verl's old-log-prob pass"):
        validate_stapo_config(_cfg(**{"algorithm.rollout_correction.bypass_mode": True}))
    validate_stapo_config(_cfg(**{"actor_rollout_ref.actor.strategy": "megatron",
                                  "actor_rollout_ref.actor.megatron": {"pipeline_model_parallel_size": 1}}))
    with pytest.raises(StapoConfigError, match="megatron.pipeline_model_parallel_size=2"):
        validate_stapo_config(_cfg(**{"actor_rollout_ref.actor.strategy": "megatron",
                                      "actor_rollout_ref.actor.megatron": {"pipeline_model_parallel_size": 2}}))
