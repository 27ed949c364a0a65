"""One job: verl's real ``TrainingWorker`` (FSDP2 at DP 1 or 2, or Megatron at TP 2; CPU platform, gloo) runs the v1
trainer's worker calls with the driver's diagnostics request set, and reports what the worker returned.

``infer_batch`` (the old-log-prob pass) on this rank's DP shard, then ``train_mini_batch`` over 2 optimizer
mini-batches of 4 rows with ``stapo_diagnostics_request=True`` (a token table is due) and the token dump on. The
8-row batch is ordered so that global mini-batch j holds the same rows at DP 1 and DP 2 (verl gives DP rank r the
r-th contiguous half and walks it in mini-batches of ``4 / dp`` rows). Rank 0 writes a JSON report: the output
metrics of the plugin (``actor/stapo/*``), verl's ``grad_norm`` per mini-batch, and the payload (rows, histograms).
argv: out_path model_dir --engine fsdp|megatron [--tp T] [--clip C] [--dump-dir D]; rank / world size / port from
``support.megatron_launch.run_job``.
"""

import argparse
import functools
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VERL_PLATFORM", "cpu")
for _k, _v in dict(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import verl  # noqa: E402,F401  (entry point: CPU platform + the plugin's patches)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from current_minibatch_job import build_worker, word_tokenizer  # noqa: E402
from support.tiny_qwen3 import VOCAB  # noqa: E402
from support.verl_batches import actor_config, tq_layout_batch  # noqa: E402

#: global row order: mini-batch 0 = rows 0,1,4,5 and mini-batch 1 = rows 2,3,6,7 at any DP size
ROWS = {1: [0, 1, 4, 5, 2, 3, 6, 7], 2: list(range(8))}


def batch():
    """The 8-row batch (fixed seed) in verl's TransferQueue layout, with advantages of both signs."""
    g = torch.Generator().manual_seed(1)
    bs, P, R = 8, 4, 6
    prompts = torch.randint(0, VOCAB, (bs, P), generator=g)
    responses = torch.randint(0, VOCAB, (bs, R), generator=g)
    attn = torch.ones(bs, P + R, dtype=torch.int64)
    attn[1, -2:] = 0
    adv = torch.tensor([1.3, 0.8, -0.5, 1.1, 0.9, 1.4, -1.0, 0.6])
    return prompts, responses, attn, adv


def main(out_path, model_dir, engine, tp, clip, dump_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from stapo_verl.core import losses as core_losses
    from stapo_verl.diagnostics.shipping import PAYLOAD_KEY, REQUEST_KEY

    worker = build_worker(engine, tp, model_dir)
    if clip is not None:
        object.__setattr__(worker.optimizer_config, "clip_grad", clip)
    worker.reset()
    cfg = actor_config("stapo", s2t_tau_p=0.0156, dump_tokens=True, dump_dir=dump_dir, table_max_rows=64,
                       mask_statistics=True)
    from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch, current_forward_keys

    worker.set_loss_fn(functools.partial(core_losses.ppo_loss, config=cfg),  # as the init_model hook does
                       prepare_batch_fn=StapoPrepareBatch(cfg, current_forward_keys(worker)))
    worker._stapo_tokenizer = word_tokenizer()
    dp = worker.engine.get_data_parallel_size()
    dp_rank = worker.engine.get_data_parallel_rank()

    prompts, responses, attn, adv = batch()
    rows = ROWS[dp][dp_rank * 8 // dp: (dp_rank + 1) * 8 // dp]
    td = tq_layout_batch(prompts[rows], responses[rows], attn[rows])
    n = len(rows)
    td["global_steps"] = torch.full((n,), 4, dtype=torch.int64)
    old_td = td.clone()
    tu.assign_non_tensor(old_td, calculate_entropy=True, compute_loss=False, temperature=1.0)
    out = worker.infer_batch(old_td)  # None off the output ranks (Megatron TP rank 1)
    box = [None if out is None else
           [response_from_nested(out[k], td["response_mask"]).to_padded_tensor(0.0) for k in ("log_probs", "entropy")]]
    if tp > 1:  # Megatron: the job's world is one TP group; its rank 0 holds the outputs
        dist.broadcast_object_list(box, src=0)
    td["old_log_probs"], td["entropy"] = (response_to_nested(x, td["response_mask"]) for x in box[0])
    R = responses.shape[1]
    td["advantages"] = response_to_nested(adv[rows][:, None].expand(n, R).contiguous(), td["response_mask"])
    tu.assign_non_tensor(td, calculate_entropy=False, temperature=1.0, global_batch_size=4, mini_batch_size=4,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False}, **{REQUEST_KEY: True})
    result = worker.train_mini_batch(td)
    if dist.get_rank() == 0:
        metrics = tu.get(result, "metrics")
        payloads = metrics.pop(PAYLOAD_KEY)
        p = payloads[0]
        report = {
            "dp": dp,
            "n_payloads": len(payloads),
            "payload_step": p.step,
            "rows": p.rows,
            "rows_selected": p.rows_selected,
            "dump": {str(rank): rows for rank, rows in p.dump.items()},  # every DP rank's rows, for the driver
            "histograms": {k: {"counts": list(h.counts), "edges": list(h.edges), "total": h.total,
                               "low": h.low, "high": h.high} for k, h in p.histograms.items()},
            "grad_norm": [float(x) for x in metrics["grad_norm"]],
            "metrics": {k: [float(x) for x in v] for k, v in metrics.items() if k.startswith("actor/stapo/")},
        }
        with open(out_path, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out_path")
    ap.add_argument("model_dir")
    ap.add_argument("--engine", choices=("fsdp", "megatron"), default="fsdp")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--clip", type=float, default=None, help="the optimizer's clip_grad (default: the builder's)")
    ap.add_argument("--dump-dir", default="")
    a = ap.parse_args()
    main(a.out_path, a.model_dir, a.engine, a.tp, a.clip, a.dump_dir)
