"""One job: verl's real ``TrainingWorker`` (FSDP2 engine, or the Megatron engine at TP>1; CPU platform) with
``stats_source=current_minibatch``.

Runs the v1 trainer's worker calls in order — ``infer_batch`` (old-log-prob pass, ``calculate_entropy=True``),
then ``train_mini_batch`` over 4 optimizer mini-batches — through the plugin's patches (installed by its entry
point), with spies on the mask's inputs and outputs (``training_worker.apply_policy_token_mask``, called on the
current-policy view and then, for the disagreement metric, on the old-policy one) and on the policy-gradient term
(the policy loss ``stapo_verl.core.losses.ppo_loss`` calls). Optionally with the token dump on (a word-level HF
tokenizer built here). Rank 0 writes a JSON report to ``out_path``; used by ``test_current_minibatch.py`` (FSDP, one process)
and ``test_megatron_engine.py`` (Megatron, one gloo rank per process started by ``support.megatron_launch.run_job``;
``RANK``/``WORLD_SIZE``/``MASTER_PORT`` from there).
argv: out_path [--port P] [--stats-source S] [--dump-dir D] [--cap N] [--engine fsdp|megatron --tp T --model-dir M]
(no ``--dump-dir`` = no dump).
"""

import argparse
import functools
import json
import os
import sys
import tempfile

os.environ.setdefault("VERL_PLATFORM", "cpu")
for _k, _v in dict(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
    os.environ.setdefault(_k, _v)  # a single process unless a launcher set them

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import verl  # noqa: E402,F401  (entry point: CPU platform + STAPO + worker hooks)

from support.tiny_qwen3 import VOCAB, tiny_qwen3  # noqa: E402
from support.verl_batches import actor_config, tq_layout_batch  # noqa: E402


def word_tokenizer():
    """HF fast tokenizer over the tiny vocabulary: token i decodes to 'w{i}' (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def build_worker(engine, tp, model_dir):
    """verl's ``TrainingWorker`` (not reset yet) over ``model_dir``: FSDP2, or Megatron at TP=``tp``, PP=1 (fp32).

    Megatron: ``vanilla_mbridge=True``, local layer spec via the CPU shims, ``sequence_parallel=False``, 2-row
    micro-batches (one per 2-row mini-batch, as FSDP's single micro-batch); ``McoreEngineConfig`` accepts bf16/fp16
    only (``verl.workers.config.McoreEngineConfig``), so this test-only job sets ``dtype="float32"`` after construction.
    Both use lr 3e-2 (so one optimizer step moves the policy visibly).
    """
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import (FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, McoreEngineConfig,
                                     McoreOptimizerConfig, TrainingWorkerConfig)
    from verl.workers.engine_workers import TrainingWorker

    # Megatron's forward_step reads tokenizer.pad_token_id (support.megatron_launch.make_model_dir ships a tokenizer)
    model_cfg = HFModelConfig(path=model_dir, load_tokenizer=engine == "megatron",
                              override_config={"attn_implementation": "sdpa"},
                              enable_gradient_checkpointing=False, use_remove_padding=True)
    opt = dict(lr=3e-2, lr_warmup_steps=0, weight_decay=0.0, total_training_steps=10)
    if engine == "fsdp":
        engine_cfg = FSDPEngineConfig(strategy="fsdp2", param_offload=False, optimizer_offload=False,
                                      use_torch_compile=False, model_dtype="fp32", micro_batch_size_per_gpu=1,
                                      infer_micro_batch_size_per_gpu=4, max_token_len_per_gpu=4096,
                                      infer_max_token_len_per_gpu=4096,
                                      mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                       "buffer_dtype": "fp32"})
        opt_cfg = FSDPOptimizerConfig(**opt)
    elif engine == "megatron":
        engine_cfg = McoreEngineConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
                                       vanilla_mbridge=True, use_distributed_optimizer=False,
                                       override_transformer_config={"sequence_parallel": False},
                                       micro_batch_size_per_gpu=2, infer_micro_batch_size_per_gpu=4,
                                       max_token_len_per_gpu=4096, infer_max_token_len_per_gpu=4096,
                                       use_dynamic_bsz=False, seed=0)
        object.__setattr__(engine_cfg, "dtype", "float32")  # test-only: fp32 (verl allows bf16/fp16 only)
        opt_cfg = McoreOptimizerConfig(**opt, clip_grad=1e6)
    else:
        raise ValueError(f"--engine must be 'fsdp' or 'megatron', got {engine!r}")
    return TrainingWorker(TrainingWorkerConfig(model_type="language_model", model_config=model_cfg,
                                               engine_config=engine_cfg, optimizer_config=opt_cfg,
                                               checkpoint_config=CheckpointConfig()))


def main(out_path, port, stats_source, dump_dir, cap, engine="fsdp", tp=1, model_dir=None):
    if port:
        os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from stapo_verl.core import losses as core_losses
    from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY
    from stapo_verl.diagnostics.shipping import REQUEST_KEY, take_payloads
    from stapo_verl.integration.verl_0_9_1 import training_worker
    from stapo_verl.minibatch.token_dump import write_step

    if model_dir is None:
        model_dir = tempfile.mkdtemp()
        tiny_qwen3(seed=0, vocab=VOCAB).save_pretrained(model_dir)
    worker = build_worker(engine, tp, model_dir)
    worker.reset()
    # mask_statistics: the diagnostics (the old-policy mask beside the current one, for the disagreement metric)
    cfg = actor_config("stapo", s2t_tau_p=0.03, stats_source=stats_source, dump_tokens=bool(dump_dir), dump_dir=dump_dir,
                       dump_max_rows_per_step=cap, mask_statistics=True)
    token_counts = []  # every value ppo_loss writes to global_batch_info["batch_num_tokens"], in order

    class RecordingBatchInfo(dict):
        def __setitem__(self, key, value):
            if key == "batch_num_tokens":
                token_counts.append(float(value))
            super().__setitem__(key, value)

    object.__setattr__(cfg, "global_batch_info", RecordingBatchInfo(cfg.global_batch_info))  # test-only spy
    from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch, current_forward_keys

    worker.set_loss_fn(functools.partial(core_losses.ppo_loss, config=cfg),  # as the init_model hook builds it
                       prepare_batch_fn=StapoPrepareBatch(cfg, current_forward_keys(worker)))
    if dump_dir:
        worker._stapo_tokenizer = word_tokenizer()

    g = torch.Generator().manual_seed(1)
    bs, P, R = 8, 4, 6
    prompts = torch.randint(0, VOCAB, (bs, P), generator=g)
    responses = torch.randint(0, VOCAB, (bs, R), generator=g)
    attn = torch.ones(bs, P + R, dtype=torch.int64)
    attn[1, -2:] = 0  # right padding in a response
    td = tq_layout_batch(prompts, responses, attn)
    td["global_steps"] = torch.full((bs,), 3, dtype=torch.int64)  # per-sample TransferQueue field (agent_loop_tq)
    n_valid = [int(td["response_mask"][i].sum()) for i in range(bs)]

    # 1. the v1 trainer's old-log-prob pass (TrainingWorker.infer_batch, calculate_entropy=True, no loss)
    old_td = td.clone()
    tu.assign_non_tensor(old_td, calculate_entropy=True, compute_loss=False, temperature=1.0)
    out = worker.infer_batch(old_td)  # None off the output rank (Megatron TP rank > 0): the dispatcher's broadcast
    box = [None if out is None else
           [response_from_nested(out[k], td["response_mask"]).to_padded_tensor(0.0) for k in ("log_probs", "entropy")]]
    dist.broadcast_object_list(box, src=0)
    td["old_log_probs"], td["entropy"] = (response_to_nested(x, td["response_mask"]) for x in box[0])
    adv = torch.tensor([1.3, 0.8, -0.5, 1.1, 0.9, 1.4, -1.0, 0.6])[:, None].expand(bs, R).contiguous()
    td["advantages"] = response_to_nested(adv, td["response_mask"])

    # spies: what the mask saw and decided (per call), what the policy-gradient term saw (per micro-batch)
    calls, losses_seen, pg_bnt, engine_bnt = [], [], [], []
    orig_apply = training_worker.apply_policy_token_mask

    def spy_apply(config, data, dp_group=None, engine=None):
        metrics = orig_apply(config, data, dp_group, engine)
        calls.append({"lp": data["old_log_probs"].to_padded_tensor(0.0).clone(),
                      "keep": data[POLICY_LOSS_MASK_KEY].to_padded_tensor(0).bool().clone(),
                      "valid": data["response_mask"].to_padded_tensor(0).bool().clone(),
                      "n_keep": int(tu.get(data, "policy_batch_num_tokens")), "metrics": dict(metrics)})
        return metrics

    orig_get_policy_loss_fn = core_losses.get_policy_loss_fn

    def spy_get_policy_loss_fn(loss_mode):
        policy_loss_fn = orig_get_policy_loss_fn(loss_mode)

        def spy(**kw):
            pg_bnt.append(float(kw["config"].global_batch_info["batch_num_tokens"]))
            engine_bnt.append(token_counts[-2])  # written at the micro-batch's start: the engine's Σ loss_mask
            losses_seen.append(kw["log_prob"].detach().clone())
            return policy_loss_fn(**kw)

        return spy

    training_worker.apply_policy_token_mask, core_losses.get_policy_loss_fn = spy_apply, spy_get_policy_loss_fn
    tu.assign_non_tensor(td, calculate_entropy=False, temperature=1.0, global_batch_size=2, mini_batch_size=2,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    tu.assign_non_tensor(td, **{REQUEST_KEY: False})  # the plugin's driver asks for the diagnostics (no table)
    result = worker.train_mini_batch(td)
    metrics = tu.get(result, "metrics") if result is not None else {}  # None off the output rank (Megatron TP>0)
    for payload in take_payloads(metrics):  # what the driver does with the rows: write every DP rank's file
        if payload.dump is not None:
            write_step(dump_dir, payload.step, payload.dump, new_session=True)
    # current_minibatch: per mini-batch the mask ran on the current policy's values, then on the old policy's
    per_mb = 2 if stats_source == "current_minibatch" else 1
    masks = []
    for j in range(len(calls) // per_mb):
        cur, old = calls[per_mb * j], calls[per_mb * j + per_mb - 1]
        valid = cur["valid"]
        masks.append({"lp": cur["lp"], "keep": cur["keep"], "n_keep": cur["n_keep"],
                      "n_masked": int(cur["metrics"]["actor/stapo/num_masked"]), "n_valid": int(valid.sum()),
                      "disagreement": int(((cur["keep"] ^ old["keep"]) & valid).sum()),
                      "lp_shift": float((cur["lp"] - old["lp"])[valid].abs().max()),
                      "equals_old_policy_mask": bool(torch.equal(cur["keep"], old["keep"]))})

    # every rank of the job (Megatron: the TP group) computed the same masks from the same current log-probs
    mine = [(m["keep"], m["lp"]) for m in masks]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    ranks_agree = all(len(o) == len(mine) and all(torch.equal(a, b) and torch.equal(c, d)
                                                  for (a, c), (b, d) in zip(o, mine)) for o in everyone)

    # per mini-batch j: did the loss's first micro-batch see the same current log-probs the mask used?
    mb_per_minibatch = len(losses_seen) // 4
    report = {
        "n_minibatches": len(masks),
        "world_size": dist.get_world_size(),
        "ranks_agree": ranks_agree,
        "lp_shift": [m["lp_shift"] for m in masks],
        "equals_old_policy_mask": [m["equals_old_policy_mask"] for m in masks],
        "n_masked": [m["n_masked"] for m in masks],
        "disagreement_expected": [m["disagreement"] for m in masks],  # keep decisions vs the old_policy mask
        "n_valid": [m["n_valid"] for m in masks],
        "n_valid_expected": [n_valid[2 * j] + n_valid[2 * j + 1] for j in range(4)],
        "pg_batch_num_tokens": pg_bnt,
        "engine_batch_num_tokens": engine_bnt,
        # per micro-batch: the engine's count, ΣK for the policy-gradient call, the engine's count again (KL/entropy)
        "batch_num_tokens_writes": [token_counts[3 * i: 3 * i + 3] for i in range(len(token_counts) // 3)],
        "n_keep": [m["n_keep"] for m in masks],
        "micro_batches_per_minibatch": mb_per_minibatch,
        # kept tokens of mini-batch j: the mask's log p vs the training forward's (1 micro-batch per mini-batch)
        "mask_lp_vs_training_lp_maxdiff": [
            float((masks[j]["lp"] - losses_seen[j])[masks[j]["keep"]].abs().max()) for j in range(4)]
        if mb_per_minibatch == 1 else None,
        "metrics": {k: (v if not isinstance(v, list) else [float(x) for x in v]) for k, v in metrics.items()
                    if k.startswith("actor/stapo/")},
    }
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(report, f, default=str)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out_path")
    ap.add_argument("--port", type=int, default=0, help="MASTER_PORT (0: keep the launcher's)")
    ap.add_argument("--stats-source", default="current_minibatch")
    ap.add_argument("--dump-dir", default="")
    ap.add_argument("--cap", type=int, default=256, help="dump_max_rows_per_step")
    ap.add_argument("--engine", choices=("fsdp", "megatron"), default="fsdp")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--model-dir", default=None)
    a = ap.parse_args()
    main(a.out_path, a.port, a.stats_source, a.dump_dir, a.cap, a.engine, a.tp, a.model_dir)
