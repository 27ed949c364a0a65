"""One-process job: verl's FSDP2 engine on the stapo_verl CPU platform, old-policy pass then a STAPO update.

Run as a script (fresh interpreter, ``VERL_PLATFORM=cpu`` set before ``import verl`` so the plugin loads the CPU
backend). Writes a JSON report to argv[1]. Used by ``test_fsdp_engine.py``.
"""

import functools
import json
import os
import sys
import tempfile

os.environ.setdefault("VERL_PLATFORM", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import verl  # noqa: E402,F401  (entry point: CPU platform + STAPO)

from support.tiny_qwen3 import VOCAB, tiny_qwen3  # noqa: E402
from support.verl_batches import actor_config, tq_layout_batch  # noqa: E402


def main(out_path, port):
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_name
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from stapo_verl.core import losses as core_losses

    pg_bnt, orig_get_policy_loss_fn = [], core_losses.get_policy_loss_fn

    def spy_get_policy_loss_fn(loss_mode):  # the PG term's denominator, per micro-batch
        policy_loss_fn = orig_get_policy_loss_fn(loss_mode)

        def spy(**kw):
            pg_bnt.append(float(kw["config"].global_batch_info["batch_num_tokens"]))
            return policy_loss_fn(**kw)

        return spy

    core_losses.get_policy_loss_fn = spy_get_policy_loss_fn

    tmp = tempfile.mkdtemp()
    tiny_qwen3(seed=0, vocab=VOCAB).save_pretrained(tmp)
    model_cfg = HFModelConfig(path=tmp, load_tokenizer=False, override_config={"attn_implementation": "sdpa"},
                              enable_gradient_checkpointing=False, use_remove_padding=True)
    engine_cfg = FSDPEngineConfig(strategy="fsdp2", param_offload=False, optimizer_offload=False,
                                  use_torch_compile=False, model_dtype="fp32",
                                  mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                   "buffer_dtype": "fp32"})
    engine = EngineRegistry.new("language_model", "fsdp2", model_config=model_cfg, engine_config=engine_cfg,
                                optimizer_config=FSDPOptimizerConfig(lr=1e-2, lr_warmup_steps=0, weight_decay=0.0,
                                                                     total_training_steps=10),
                                checkpoint_config=CheckpointConfig())
    engine.initialize()

    g = torch.Generator().manual_seed(1)
    bs, P, R = 4, 5, 6
    prompts = torch.randint(0, VOCAB, (bs, P), generator=g)
    responses = torch.randint(0, VOCAB, (bs, R), generator=g)
    attn = torch.ones(bs, P + R, dtype=torch.int64)
    attn[0, :2] = 0  # left padding in the prompt
    attn[1, -2:] = 0  # right padding in the response

    def batch():
        td = tq_layout_batch(prompts, responses, attn)  # TransferQueue layout (agent_loop_tq)
        tu.assign_non_tensor(td, use_remove_padding=True, use_dynamic_bsz=False, micro_batch_size_per_gpu=2,
                             max_token_len_per_gpu=4096, use_fused_kernels=False, temperature=1.0,
                             global_batch_size=bs, mini_batch_size=bs, epochs=1, seed=0)
        return td

    # 1. old-policy pass, as the v1 trainer's _compute_old_log_prob (calculate_entropy=True, no loss)
    td = batch()
    tu.assign_non_tensor(td, calculate_entropy=True)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)
    mo = out["model_output"]
    old_lp = response_from_nested(mo["log_probs"], td["response_mask"])
    ent = response_from_nested(mo["entropy"], td["response_mask"])

    # 1b. only the policy-gradient term sees the mask: cispo with and without token_mask=s2t, KL loss and an entropy
    #     term on, on the same weights through the engine's own forward (infer_batch with the loss)
    adv = torch.tensor([1.3, 0.8, -0.5, 1.1])[:, None].expand(bs, R).contiguous()

    def probe(token_mask):
        t = batch()
        tu.assign_non_tensor(t, calculate_entropy=True)
        t["old_log_probs"], t["entropy"] = old_lp, ent
        t["advantages"] = response_to_nested(adv, t["response_mask"])
        ref = response_from_nested(old_lp, t["response_mask"]).to_padded_tensor(0.0)
        t["ref_log_prob"] = response_to_nested(ref + 0.05 * torch.arange(R)[None, :], t["response_mask"])
        c = actor_config("cispo", token_mask, s2t_tau_p=0.03, use_kl_loss=True, entropy_coeff=0.01)
        mask_metrics = core_losses.apply_policy_token_mask(c, t, engine.get_data_parallel_group()) if token_mask else {}
        with engine.eval_mode():
            out = engine.infer_batch(t, loss_function=functools.partial(core_losses.ppo_loss, config=c))
        metrics = {k: float(v.aggregate()) if hasattr(v, "aggregate") else float(sum(v) / len(v))
                   for k, v in out["metrics"].items() if k in ("kl_loss", "actor/entropy_loss", "actor/pg_loss")}
        return metrics, mask_metrics

    plain, _ = probe(None)
    masked, probe_mask = probe("s2t")

    # 2. the update's mini-batch: old values + advantages in response layout, as TransferQueue delivers them
    td = batch()
    tu.assign_non_tensor(td, calculate_entropy=False)
    td["old_log_probs"], td["entropy"] = old_lp, ent
    td["advantages"] = response_to_nested(adv, td["response_mask"])
    cfg = actor_config("stapo", s2t_tau_p=0.03)  # random tiny model: p ≈ 1/64 ⇒ candidates exist
    pg_bnt.clear()  # the probes above ran the masked loss too
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    n_valid = int(td["loss_mask"].values().sum())
    mask_metrics = core_losses.apply_policy_token_mask(cfg, td, engine.get_data_parallel_group())
    with engine.train_mode():
        result = engine.train_batch(td, loss_function=functools.partial(core_losses.ppo_loss, config=cfg))
    changed = {n: float((p.detach() - before[n]).abs().max()) for n, p in engine.module.named_parameters()}
    metrics = {k: (v.values if hasattr(v, "values") else v) for k, v in result["metrics"].items()}
    report = {
        "device": get_device_name(),
        "n_valid": n_valid,
        "n_masked": int(mask_metrics["actor/stapo/num_masked"]),
        "n_candidates": int(mask_metrics["actor/stapo/num_candidates"]),
        "batch_num_tokens": int(td["batch_num_tokens"]),
        "pg_batch_num_tokens": pg_bnt,
        "loss_mask_sum": int(td["loss_mask"].values().sum()),
        "max_change": max(changed.values()),
        "n_changed": sum(v > 0 for v in changed.values()),
        "n_params": len(changed),
        "metric_keys": sorted(set(metrics) | set(mask_metrics)),
        "masked_frac": mask_metrics["actor/stapo/masked_frac"],
        "grad_norm": float(metrics["grad_norm"]),
        "kl_probe": {"plain": plain, "masked": masked, "masked_tokens": probe_mask["actor/stapo/num_masked"]},
    }
    with open(out_path, "w") as f:
        json.dump(report, f, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
