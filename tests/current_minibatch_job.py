"""One-process job: verl's real ``TrainingWorker`` (FSDP2 engine, CPU platform) with ``stats_source=current_minibatch``.

Runs the v1 trainer's worker calls in order — ``infer_batch`` (old-log-prob pass, ``calculate_entropy=True``),
then ``train_mini_batch`` over 4 optimizer mini-batches — through the stapo_verl hooks (installed by the plugin's
entry point), with spies on the mask inputs, the loss inputs and the PG denominator. Optionally with the token
dump on (a word-level HF tokenizer built here). Writes a JSON report to argv[1]; used by
``test_current_minibatch_on_cpu.py``. argv: out_path port stats_source [dump_dir [dump_max_rows_per_step]] (no dump_dir = no dump).
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

import verl  # noqa: E402,F401  (entry point: CPU platform + STAPO + worker hooks)

sys.path.insert(0, os.path.dirname(__file__))
from helpers import actor_config  # noqa: E402
from tiny_qwen3 import VOCAB, tiny_qwen3  # noqa: E402


def word_tokenizer():
    """HF fast tokenizer over the tiny vocabulary: token i decodes to 'w{i}' (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def main(out_path, port, stats_source, dump_dir, cap):
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    from tensordict import TensorDict
    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, response_from_nested, response_to_nested

    import stapo_verl.losses as losses
    import stapo_verl.worker_hooks as hooks
    from stapo_verl.state import KEEP_FIELD

    tmp = tempfile.mkdtemp()
    tiny_qwen3(seed=0, vocab=VOCAB).save_pretrained(tmp)
    model_cfg = HFModelConfig(path=tmp, load_tokenizer=False, override_config={"attn_implementation": "sdpa"},
                              enable_gradient_checkpointing=False, use_remove_padding=True)
    engine_cfg = FSDPEngineConfig(strategy="fsdp2", param_offload=False, optimizer_offload=False,
                                  use_torch_compile=False, model_dtype="fp32", micro_batch_size_per_gpu=1,
                                  infer_micro_batch_size_per_gpu=4, max_token_len_per_gpu=4096,
                                  infer_max_token_len_per_gpu=4096,
                                  mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                   "buffer_dtype": "fp32"})
    worker = TrainingWorker(TrainingWorkerConfig(
        model_type="language_model", model_config=model_cfg, engine_config=engine_cfg,
        optimizer_config=FSDPOptimizerConfig(lr=3e-2, lr_warmup_steps=0, weight_decay=0.0, total_training_steps=10),
        checkpoint_config=CheckpointConfig()))
    worker.reset()
    cfg = actor_config("stapo", tau_p=0.03, stats_source=stats_source, dump_tokens=bool(dump_dir), dump_dir=dump_dir,
                       dump_max_rows_per_step=cap)
    worker.set_loss_fn(functools.partial(ppo_loss, config=cfg))
    if dump_dir:
        worker._stapo_tokenizer = word_tokenizer()

    g = torch.Generator().manual_seed(1)
    bs, P, R = 8, 4, 6
    prompts = torch.randint(0, VOCAB, (bs, P), generator=g)
    responses = torch.randint(0, VOCAB, (bs, R), generator=g)
    attn = torch.ones(bs, P + R, dtype=torch.int64)
    attn[1, -2:] = 0  # right padding in a response
    rmask = attn[:, P:].clone()
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    td = TensorDict({"input_ids": torch.cat([prompts, responses], 1), "attention_mask": attn,
                     "response_mask": rmask, "position_ids": pos, "prompts": prompts, "responses": responses},
                    batch_size=[bs])
    td = left_right_2_no_padding(td)
    valid = attn.bool()
    nest = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    td["prompts"] = nest([prompts[i][valid[i, :P]] for i in range(bs)])
    td["responses"] = nest([responses[i][valid[i, P:]] for i in range(bs)])
    td["response_mask"] = nest([rmask[i][valid[i, P:]] for i in range(bs)])
    td["loss_mask"] = nest([rmask[i][valid[i, P:]] for i in range(bs)])
    td["global_steps"] = torch.full((bs,), 3, dtype=torch.int64)  # per-sample TransferQueue field (agent_loop_tq)
    n_valid = [int(td["response_mask"][i].sum()) for i in range(bs)]

    # 1. the v1 trainer's old-log-prob pass (TrainingWorker.infer_batch, calculate_entropy=True, no loss)
    old_td = td.clone()
    tu.assign_non_tensor(old_td, calculate_entropy=True, compute_loss=False, temperature=1.0)
    out = worker.infer_batch(old_td)
    td["old_log_probs"] = response_from_nested(out["log_probs"], td["response_mask"])
    td["entropy"] = response_from_nested(out["entropy"], td["response_mask"])
    adv = torch.tensor([1.3, 0.8, -0.5, 1.1, 0.9, 1.4, -1.0, 0.6])[:, None].expand(bs, R).contiguous()
    td["advantages"] = response_to_nested(adv, td["response_mask"])

    # spies: what the mask saw, what the loss saw, the PG denominator
    masks, losses_seen, pg_bnt, engine_bnt = [], [], [], []
    orig_apply = hooks.apply_s2t_to_minibatch

    def spy_apply(data, pl, dp_group=None, **kw):
        # the old-policy mask of this very mini-batch, computed independently with stats_source=old_policy
        ref = data.clone()
        ref_stats = orig_apply(ref, actor_config("stapo", tau_p=0.03).policy_loss, dp_group)
        hooks.state.MINIBATCH.mask_calls -= 1  # keep the seed sequence of the real call
        stats, keep, lp, ent, adv_, valid_ = orig_apply(data, pl, dp_group, **kw)
        old_lp = data["old_log_probs"].to_padded_tensor(0.0)
        masks.append({"lp": lp.clone(), "keep": keep.clone(), "n_masked": stats.n_masked, "n_valid": stats.n_valid, "n_keep": stats.n_keep,
                      "uses_old": bool(torch.equal(lp, old_lp)),
                      "lp_shift": float((lp - old_lp)[valid_].abs().max()),
                      "equals_old_policy_mask": bool(torch.equal(keep, ref[KEEP_FIELD].to_padded_tensor(0).bool()))
                      and stats.n_masked == ref_stats.n_masked and stats.tau_h == ref_stats.tau_h})
        return stats, keep, lp, ent, adv_, valid_

    orig_vanilla = losses.compute_policy_loss_vanilla

    def spy_vanilla(**kw):
        pg_bnt.append(float(kw["config"].global_batch_info["batch_num_tokens"]))
        losses_seen.append(kw["log_prob"].detach().clone())
        return orig_vanilla(**kw)

    orig_inner_ppo = worker.loss_fn

    def spy_ppo(model_output, data, dp_group=None):
        engine_bnt.append(float(data["batch_num_tokens"]))
        return orig_inner_ppo(model_output=model_output, data=data, dp_group=dp_group)

    spy_ppo.keywords = orig_inner_ppo.keywords
    worker.loss_fn = spy_ppo
    hooks.apply_s2t_to_minibatch, losses.compute_policy_loss_vanilla = spy_apply, spy_vanilla
    tu.assign_non_tensor(td, calculate_entropy=False, temperature=1.0, global_batch_size=2, mini_batch_size=2,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    result = worker.train_mini_batch(td)
    metrics = tu.get(result, "metrics")

    # per mini-batch j: did the loss's first micro-batch see the same current log-probs the mask used?
    mb_per_minibatch = len(losses_seen) // 4
    report = {
        "n_minibatches": len(masks),
        "uses_old": [m["uses_old"] for m in masks],
        "lp_shift": [m["lp_shift"] for m in masks],
        "equals_old_policy_mask": [m["equals_old_policy_mask"] for m in masks],
        "n_masked": [m["n_masked"] for m in masks],
        "n_valid": [m["n_valid"] for m in masks],
        "n_valid_expected": [n_valid[2 * j] + n_valid[2 * j + 1] for j in range(4)],
        "pg_batch_num_tokens": pg_bnt,
        "engine_batch_num_tokens": engine_bnt,
        "n_keep": [m["n_keep"] for m in masks],
        "micro_batches_per_minibatch": mb_per_minibatch,
        # kept tokens of mini-batch j: the mask's log p vs the training forward's (1 micro-batch per mini-batch)
        "mask_lp_vs_training_lp_maxdiff": [
            float((masks[j]["lp"] - losses_seen[j])[masks[j]["keep"]].abs().max()) for j in range(4)]
        if mb_per_minibatch == 1 else None,
        "metrics": {k: (v if not isinstance(v, list) else [float(x) for x in v]) for k, v in metrics.items()
                    if k.startswith("actor/stapo/")},
    }
    with open(out_path, "w") as f:
        json.dump(report, f, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "",
         int(sys.argv[5]) if len(sys.argv) > 5 else 256)
