"""One job: the same batches through verl's real ``TrainingWorker`` with the plugin installed (``--path plugin``) or
through the upstream series' ``TrainingWorker`` (``--path series``: verl 0.9.1's ``engine_workers.py`` with the series
applied, :mod:`support.series`), on the FSDP2 or the Megatron engine (CPU platform, one process).

The plugin's path is what its ``init_model`` hook sets up (``policy_token_mask_fn = StapoPrepareBatch(...)``); the
series' is what the series' ``init_model`` sets up (``partial(apply_policy_token_mask, actor_config)``), or, for
``stats_source=current_minibatch`` (an option of the plugin only), the plugin's pre-pass on the series' worker. Both get a
caller's pre-pass through ``set_loss_fn`` (it writes a field the mask never reads). The job runs the v1 trainer's
worker calls: the old-log-prob ``infer_batch`` pass, ``train_mini_batch`` over 4 optimizer mini-batches, then another
``infer_batch`` (the log-probs of the updated weights). It writes, as JSON: the mask and its count the engine received
for each mini-batch, the returned metrics and the log-probs after the update.
argv: out_path --path plugin|series --engine fsdp|megatron --model-dir M [--stats-source S]
"""

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VERL_PLATFORM", "cpu")
for _k, _v in dict(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import verl  # noqa: E402,F401  (entry point: CPU platform + the plugin's hooks)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "diagnostics"))
from current_minibatch_job import build_worker  # noqa: E402
from support.verl_batches import actor_config, tq_layout_batch  # noqa: E402
from worker_job import batch  # noqa: E402


def callers_pre_pass(data, *, engine, dp_group):
    """A caller's pre-pass (a user's, another plugin's): a field of its own, one metric."""
    data["callers_field"] = data["response_mask"].clone()
    return {"actor/callers_pre_pass": 1.0}


def main(out_path, path, engine, model_dir, stats_source):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import verl.workers.engine_workers as engine_workers
    import verl.workers.utils.losses as verl_losses
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from stapo_verl.core import losses as core_losses
    from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch, current_forward_keys

    if path == "series":
        from support.series import load_series_module

        verl_losses.apply_policy_token_mask = core_losses.apply_policy_token_mask  # what PR A adds there
        verl_losses.run_prepare_batch = core_losses.run_prepare_batch
        series = load_series_module("verl/workers/engine_workers.py", Path(tempfile.mkdtemp()))
        engine_workers.TrainingWorker = series.TrainingWorker  # build_worker builds this class
    worker = build_worker(engine, 1, model_dir)
    worker.reset()
    cfg = actor_config("stapo", s2t_tau_p=0.03, stats_source=stats_source)
    loss = functools.partial(core_losses.ppo_loss, config=cfg)
    worker.set_loss_fn(loss, prepare_batch_fn=callers_pre_pass)
    if path == "series" and stats_source == "old_policy":  # the series' ActorRolloutRefWorker.init_model
        worker.policy_token_mask_fn = functools.partial(core_losses.apply_policy_token_mask, cfg)
    elif path == "series":  # the series has no current_minibatch: the plugin's pre-pass on the series' contract
        worker.policy_token_mask_fn = StapoPrepareBatch(cfg, current_forward_keys(worker))
    else:  # the plugin's init_model hook
        worker.policy_token_mask_fn = StapoPrepareBatch(cfg, current_forward_keys(worker))

    engine_saw = []
    engine_train_batch = worker.engine.train_batch

    def recording_train_batch(data, loss_function=None):
        engine_saw.append({"mask": data["policy_loss_mask"].to_padded_tensor(0).tolist(),
                           "count": int(tu.get(data, "policy_batch_num_tokens")),
                           "callers_field": "callers_field" in data.keys(),
                           "training": all(m.training for m in _modules(worker.engine))})
        return engine_train_batch(data, loss_function=loss_function)

    worker.engine.train_batch = recording_train_batch

    prompts, responses, attn, adv = batch()  # the diagnostics worker job's batch (fixed seed)
    bs, R = responses.shape
    td = tq_layout_batch(prompts, responses, attn)
    td["global_steps"] = torch.full((bs,), 3, dtype=torch.int64)

    def log_probs(batch):
        old_td = batch.clone()
        tu.assign_non_tensor(old_td, calculate_entropy=True, compute_loss=False, temperature=1.0)
        out = worker.infer_batch(old_td)
        return [response_from_nested(out[k], batch["response_mask"]).to_padded_tensor(0.0) for k in
                ("log_probs", "entropy")]

    old_lp, ent = log_probs(td)
    td["old_log_probs"], td["entropy"] = (response_to_nested(x, td["response_mask"]) for x in (old_lp, ent))
    td["advantages"] = response_to_nested(adv[:, None].expand(bs, R).contiguous(), td["response_mask"])
    tu.assign_non_tensor(td, calculate_entropy=False, temperature=1.0, global_batch_size=2, mini_batch_size=2,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    result = worker.train_mini_batch(td)
    metrics = {k: ([float(x) for x in v] if isinstance(v, list) else float(v))
               for k, v in tu.get(result, "metrics").items() if isinstance(v, int | float | list)}
    new_lp, _ = log_probs(td)
    report = {"engine_saw": engine_saw, "metrics": metrics, "log_probs_after": new_lp.tolist()}
    with open(out_path, "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def _modules(engine):
    roots = engine.module if isinstance(engine.module, list | tuple) else [engine.module]
    return [m for root in roots for m in root.modules()]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out_path")
    ap.add_argument("--path", choices=("plugin", "series"), required=True)
    ap.add_argument("--engine", choices=("fsdp", "megatron"), default="fsdp")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--stats-source", default="old_policy")
    a = ap.parse_args()
    main(a.out_path, a.path, a.engine, a.model_dir, a.stats_source)
