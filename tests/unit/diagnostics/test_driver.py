"""The driver side: verl's real ``PPOTrainer._update_actor`` (as the plugin wraps it) on a trainer stand-in whose
worker group returns what the actor workers return, with verl's real ``Tracking`` writing TensorBoard files.

Checks the request the workers get, that the payload never reaches verl's ``reduce_metrics`` (and that it would
break it), that tables and histograms reach the tracker, that the driver writes every DP rank's token dump in the run
directory (an empty file for a rank that silenced nothing) and replaces an interrupted attempt's rows on resume, and
the collapse z-scores and warning of a run.
"""

import math
import statistics
import types

import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import stapo_verl.plugin  # noqa: F401  (installs the integration, as verl's entry point does)
from stapo_verl.integration.verl_0_9_1.opt_in_ledger import install_opt_in
from stapo_verl.diagnostics.shipping import PAYLOAD_KEY, REQUEST_KEY, DiagnosticsPayload
from stapo_verl.diagnostics.stats import Histogram
from stapo_verl.integration.verl_0_9_1.policy_loss.config import stapo_target

ROW = {"step": 2, "minibatch": 0, "dp_rank": 1, "sample_index": 0, "position": 4, "token_id": 17, "token": "x",
       "context": "a ⟦x⟧ b", "p": 1e-4, "entropy": 0.3, "advantage": 1.0, "tau_h": 0.7, "tau_p": 0.002,
       "kind": "silenced", "loss_mode": "stapo", "stats_source": "old_policy"}


def _config(**policy_loss):
    pl = {"_target_": stapo_target(), "loss_mode": "stapo", "token_mask": "s2t", "dump_tokens": True,
          "collapse_warmup_steps": 2, "collapse_z_threshold": 3.0, **policy_loss}
    return OmegaConf.create({
        "trainer": {"test_freq": 2},
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": 2, "calculate_entropy": False, "entropy_coeff": 0.0, "ppo_epochs": 1,
                      "data_loader_seed": 1, "shuffle": False, "policy_loss": pl},
            "rollout": {"n": 4, "temperature": 1.0},
        },
    })


class WorkerGroup:
    """Returns what ``ActorRolloutRefWorker.update_actor`` returns to the driver: a TensorDict whose ``metrics`` hold
    lists over mini-batches (verl's ``train_mini_batch``), with the payload when the request asked for it."""

    def __init__(self):
        self.requests = []
        self.step = 0  # the trainer's global step, set by _update

    def update_actor(self, batch):
        from verl.utils import tensordict_utils as tu

        request = batch.extra_info.get(REQUEST_KEY)
        self.requests.append(request)
        metrics = {"loss": [0.5, 0.7], "mfu": [0.1, 0.1], "grad_norm": [2.0, 4.0]}
        if request is not None:
            h = Histogram.of(torch.tensor([0.3, 0.5]), (0.0, 1.0, 2.0))
            # rank 0 silenced nothing, rank 1 one token (a dump of every DP rank, as gather_rows sends it)
            dump = {0: [], 1: [{**ROW, "step": self.step, "context": f"attempt {len(self.requests)}"}]}
            metrics[PAYLOAD_KEY] = [DiagnosticsPayload(step=self.step, histograms={"entropy_adv_pos": h},
                                                       rows=[ROW] if request else None, rows_selected=1, dump=dump)]
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


@pytest.fixture(scope="module", autouse=True)
def diagnostics_installed():
    """The diagnostics' trainer wrappers, as a Ray process installs them when the driver names the option in
    ``STAPO_VERL_OPT_INS`` (they pass through for a job that does not ask)."""
    install_opt_in("diagnostics")


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    from verl.utils.tracking import Tracking

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "run" / "metrics.jsonl"))  # the run directory
    t = types.SimpleNamespace(config=_config(), global_steps=1, total_training_steps=4, actor_rollout_wg=WorkerGroup(),
                              logger=Tracking("p", "e", default_backend=["tensorboard"]))
    yield t
    t.logger.finish()


def _update(trainer, step, entropy=1.0):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer.global_steps = trainer.actor_rollout_wg.step = step
    batch = types.SimpleNamespace(extra_info={})
    metrics = {"actor/entropy": entropy}
    PPOTrainer._update_actor(trainer, batch, metrics)
    return batch, metrics


def test_payload_is_taken_out_before_verls_reduction_and_logged(trainer, tmp_path):
    bound = trainer.actor_rollout_wg.update_actor
    batch, metrics = _update(trainer, 1)
    assert REQUEST_KEY not in batch.extra_info and PAYLOAD_KEY not in str(metrics)
    assert metrics["actor/loss"] == pytest.approx(0.6) and metrics["actor/grad_norm"] == pytest.approx(3.0)
    assert trainer.actor_rollout_wg.update_actor == bound and "update_actor" not in vars(trainer.actor_rollout_wg)
    _update(trainer, 2)
    # test_freq=2: the table is due at step 2 only (dump_every=null: at each validation)
    assert trainer.actor_rollout_wg.requests == [False, True]
    trainer.logger.finish()
    ea = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0, "histograms": 0})
    ea.Reload()
    assert [e.step for e in ea.Histograms("actor/stapo/hist/entropy_adv_pos")] == [1, 2]
    (text,) = ea.Tensors("actor/stapo/tokens/text_summary")
    assert text.step == 2 and "| a ⟦x⟧ b |" in text.tensor_proto.string_val[0].decode()


def test_the_driver_writes_every_ranks_dump_and_a_resume_replaces_the_interrupted_rows(trainer, tmp_path):
    import json

    run = tmp_path / "run"
    for step in (1, 2, 3):
        _update(trainer, step)
    rows = {rank: [json.loads(x) for x in (run / f"stapo_tokens.dp{rank}.jsonl").read_text().splitlines()]
            for rank in (0, 1)}
    assert rows[0] == [] and [(r["step"], r["context"]) for r in rows[1]] == [(1, "attempt 1"), (2, "attempt 2"),
                                                                           (3, "attempt 3")]
    # a new driver process resumes from the step-1 checkpoint: steps 2-3 are trained again, their rows replaced
    from stapo_verl.integration.verl_0_9_1.trainer import _STATE

    del vars(trainer)[_STATE]
    trainer.actor_rollout_wg = WorkerGroup()
    for step in (2, 3):
        _update(trainer, step)
    again = [json.loads(x) for x in (run / "stapo_tokens.dp1.jsonl").read_text().splitlines()]
    assert [(r["step"], r["context"]) for r in again] == [(1, "attempt 1"), (2, "attempt 1"), (3, "attempt 2")]
    assert (run / "stapo_tokens.dp0.jsonl").read_text() == ""


def test_without_the_plugin_wrapper_the_payload_breaks_verls_reduction(trainer):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    batch = types.SimpleNamespace(extra_info={REQUEST_KEY: True})
    with pytest.raises(TypeError):  # reduce_metrics averages the list of payloads
        PPOTrainer._update_actor.__wrapped__(trainer, batch, {})


def test_collapse_z_scores_join_the_metrics_and_warn_once_past_the_threshold(trainer, capsys):
    zs = []
    for step, h in enumerate([1.0, 1.1, 0.9, 1.0, 0.2], 1):
        _, metrics = _update(trainer, step, entropy=h)
        zs.append(metrics.get("actor/stapo/collapse/entropy_z"))
    logs = [math.log(h) for h in (1.0, 1.1, 0.9, 1.0)]  # the monitor scores the logs (docs/diagnostics.md)
    assert zs[:2] == [None, None]
    assert zs[2] == pytest.approx((logs[2] - statistics.fmean(logs[:2])) / statistics.stdev(logs[:2]), rel=1e-9)
    assert zs[4] == pytest.approx((math.log(0.2) - statistics.fmean(logs)) / statistics.stdev(logs), rel=1e-9)
    lines = [x for x in capsys.readouterr().out.splitlines() if "collapse warning" in x]
    assert len(lines) == 1 and lines[0].startswith(
        "[stapo] collapse warning at step 5: actor/entropy = 0.2 is 19.6 sd below its running geometric mean 0.9975 "
        "(sd a factor 1.09 on the log scale, previous 4 steps")
    assert "tracker table actor/stapo/tokens (last at step 5)" in lines[0]
    assert "stapo_tokens.dp*.jsonl. No action taken." in lines[0]


def test_runs_without_the_plugin_config_are_untouched(trainer):
    trainer.config.actor_rollout_ref.actor.policy_loss = OmegaConf.create({"loss_mode": "vanilla"})
    batch, metrics = _update(trainer, 2)
    assert trainer.actor_rollout_wg.requests == [None] and "actor/stapo/collapse/entropy_z" not in metrics
