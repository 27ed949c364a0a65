"""One rank of a gloo job: verl 0.9.1's real ``MegatronEngineWithLMHead`` on the CPU with STAPO (fp32).

Started N times by ``test_megatron_engine.py`` (``RANK``/``WORLD_SIZE`` in the environment,
``VERL_PLATFORM=cpu`` so the plugin's entry point loads ``stapo_verl.cpu`` and its Megatron shims exactly as in a Ray
worker). ``vanilla_mbridge=True`` (mbridge 0.15.1 loads the HF weights), local layer spec,
``sequence_parallel=False``. ``McoreEngineConfig`` only accepts bf16/fp16 (``verl.workers.config.McoreEngineConfig``);
this test-only job sets ``dtype="float32"`` after construction so layouts can be compared to ~1e-6.

argv: out.pt model_dir tp pp

1. ``infer_batch`` with ``calculate_entropy=True`` (the v1 trainer's old-log-prob pass) → log-probs, entropy.
2. Two ``train_batch`` calls on the same 8-row mini-batch (2-row micro-batches), each through the plugin's own
   ``TrainingWorker.train_batch`` wrapper (``stapo_verl.integration.verl_0_9_1.worker.wrap_train_batch``)
   around a minimal worker whose loss is the plugin's ``ppo_loss``: ``loss_mode=stapo`` (vanilla + the S2T mask
   from step 1's old-policy values, DP-gathered) on the initial weights, then ``loss_mode=gspo`` with
   ``token_mask=s2t`` on the updated ones. Each micro-batch's policy-gradient inputs (the mask, its denominator)
   are recorded at ``stapo_verl.core.losses.ppo_loss`` and at the policy loss it calls.
Grads (captured before the optimizer step) and weights are exported to HF names through the bridge, so layouts
compare element-wise. Rank 0 writes the report.
"""

import functools
import os
import sys
import time
from types import SimpleNamespace

# STAPO_JOB_DEVICE=cuda: the same job on a GPU in bf16 (benchmarks/gpu_check.sh; never in CI)
DEVICE = os.environ.get("STAPO_JOB_DEVICE", "cpu")
# STAPO_JOB_WEIGHTS=bridge: verl's default weight path, Megatron-Bridge (megatron.vanilla_mbridge=False; the
# STAPO_STACK=bridge environment), with verl's per-tensor export to the rollout as the export; mbridge otherwise
WEIGHTS = os.environ.get("STAPO_JOB_WEIGHTS", "mbridge")
if WEIGHTS not in ("mbridge", "bridge"):
    raise SystemExit(f"STAPO_JOB_WEIGHTS={WEIGHTS!r}: allowed mbridge, bridge")
if DEVICE == "cpu":
    os.environ.setdefault("VERL_PLATFORM", "cpu")
else:
    os.environ.pop("VERL_PLATFORM", None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import verl  # noqa: E402,F401  (entry point: CPU platform + megatron shims + STAPO)

from support.megatron_launch import BS, MICRO  # noqa: E402
from support.verl_batches import actor_config, tq_layout_batch  # noqa: E402

#: the two optimizer steps of the job: (name, loss_mode, token_mask)
ROUTES = (("old_policy", "stapo", None), ("gspo", "gspo", "s2t"))


def make_batch(seed=1, vocab=64):
    """(bs) variable-length prompt/response pairs in verl's no-padding layout, identical on every rank."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    P, R = 5, 7
    prompts = torch.randint(0, vocab, (BS, P), generator=g)
    responses = torch.randint(0, vocab, (BS, R), generator=g)
    attn = torch.ones(BS, P + R, dtype=torch.int64)
    for i in range(BS):
        attn[i, : int(torch.randint(0, 3, (1,), generator=g))] = 0  # left padding
        attn[i, P + R - int(torch.randint(0, 4, (1,), generator=g)):] = 0  # right padding
    td = tq_layout_batch(prompts, responses, attn)
    tu.assign_non_tensor(td, use_remove_padding=True, use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO,
                         max_token_len_per_gpu=4096, use_fused_kernels=False, temperature=1.0,
                         global_batch_size=BS, mini_batch_size=BS, epochs=1, seed=0,
                         max_response_len=-1)  # pad per micro-batch, like the response-layout fields
    return td


def dp_shard(td, rank, size):
    """This DP rank's contiguous share of the mini-batch (as the dispatcher hands it out)."""
    from verl.utils import tensordict_utils as tu

    return tu.chunk_tensordict(td, size)[rank]


def build_engine(model_dir, tp, pp):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, McoreEngineConfig, McoreOptimizerConfig
    from verl.workers.engine.base import EngineRegistry

    model_cfg = HFModelConfig(path=model_dir)
    engine_cfg = McoreEngineConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                   vanilla_mbridge=WEIGHTS == "mbridge", use_distributed_optimizer=WEIGHTS == "bridge",
                                   override_transformer_config={"sequence_parallel": False},
                                   micro_batch_size_per_gpu=MICRO, use_dynamic_bsz=False, seed=0)
    if DEVICE == "cpu":
        object.__setattr__(engine_cfg, "dtype", "float32")  # test-only: fp32 parity (verl allows bf16/fp16 only)
    opt_cfg = McoreOptimizerConfig(lr=1e-3, lr_warmup_steps=0, weight_decay=0.0, total_training_steps=10,
                                   clip_grad=1e6)
    engine = EngineRegistry.new("language_model", "megatron", model_config=model_cfg, engine_config=engine_cfg,
                                optimizer_config=opt_cfg, checkpoint_config=CheckpointConfig())
    engine.initialize()
    return engine


def export_hf(engine):
    """{hf_name: full fp32 tensor} of the engine's weights, gathered over TP/PP by the bridge (collective): mbridge's
    ``export_weights``, or for Megatron-Bridge verl's own per-tensor export to the rollout (``get_per_tensor_param``,
    Megatron-Bridge's ``export_hf_weights``)."""
    if engine.vanilla_bridge:
        per_tensor = engine.bridge.export_weights(engine.module)
    else:
        per_tensor, _peft = engine.get_per_tensor_param()
    return {k: v.detach().float().cpu().clone() for k, v in per_tensor}


def export_grads(engine, grads):
    """Same as :func:`export_hf` for the captured main grads (swapped into ``param.data`` for the export)."""
    params = [p for chunk in engine.module for p in chunk.parameters()]
    saved = [p.data for p in params]
    for p, g in zip(params, grads):
        p.data = g
    try:
        return export_hf(engine)
    finally:
        for p, d in zip(params, saved):
            p.data = d


def route_config(loss_mode, token_mask):
    """The actor config of a route; τ_p = 0.03 because on the random tiny model p ≈ 1/64, so candidates exist."""
    return actor_config(loss_mode, token_mask, s2t_tau_p=0.03)


def run_train_batch(engine, td, cfg):
    """One optimizer step: the plugin's own ``TrainingWorker.train_batch`` wrapper around a minimal worker (the engine
    and the plugin's ``ppo_loss`` with actor config ``cfg``); returns the output rank's metrics TensorDict (else None)."""
    from verl.utils import tensordict_utils as tu

    from stapo_verl.core import losses as core_losses
    from stapo_verl.integration.verl_0_9_1.worker import wrap_train_batch

    from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch

    from support.workers import as_training_worker

    worker = as_training_worker(SimpleNamespace(engine=engine, prepare_batch_fn=StapoPrepareBatch(cfg, {}),
                                                loss_fn=functools.partial(core_losses.ppo_loss, config=cfg)))

    def verl_train_batch(self, data):  # without a pre-pass (not the case here): verl's own method
        raise AssertionError("the plugin's wrapper must run the series' train_batch for a worker with a pre-pass")

    # the series' train_batch: the pre-pass in the engine's train mode, engine.train_batch, metrics out (output rank)
    return wrap_train_batch(verl_train_batch)(worker, td)


def timed_pairs(engine, full, pairs, dp_rank, dp_size):
    """``pairs`` interleaved optimizer steps of ``loss_mode=stapo`` and ``vanilla`` on the same mini-batch (the order
    alternating, A B, B A, ...), each timed from the batch's hand-over to the step's end (device synchronized).

    Returns: {"stapo": [s, ...], "vanilla": [s, ...]} wall seconds per step, and the per-pair ratios stapo/vanilla.
    """
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_torch_device

    cfgs = {"stapo": route_config("stapo", None), "vanilla": route_config("vanilla", None)}
    walls = {"stapo": [], "vanilla": []}
    for i in range(pairs):
        for name in (("stapo", "vanilla") if i % 2 == 0 else ("vanilla", "stapo")):
            td = dp_shard(full.clone(), dp_rank, dp_size)
            tu.assign_non_tensor(td, calculate_entropy=False)
            get_torch_device().synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            run_train_batch(engine, td, cfgs[name])
            get_torch_device().synchronize()
            walls[name].append(time.perf_counter() - t0)
    walls["ratios"] = [s / v for s, v in zip(walls["stapo"], walls["vanilla"])]
    return walls


def train_step(engine, full, route, dp_rank, dp_size):
    """One ``train_batch`` through the plugin's ``TrainingWorker.train_batch`` wrapper; returns what rank 0 reports."""
    from verl.utils import tensordict_utils as tu

    from stapo_verl.core import losses as core_losses

    td = dp_shard(full.clone(), dp_rank, dp_size)
    _, loss_mode, token_mask = next(r for r in ROUTES if r[0] == route)
    cfg = route_config(loss_mode, token_mask)
    tu.assign_non_tensor(td, calculate_entropy=False)
    seen = []
    orig_loss, orig_get_policy_loss_fn = core_losses.ppo_loss, core_losses.get_policy_loss_fn

    def recording_loss(config, model_output, data, dp_group=None):  # what one micro-batch carries into the loss
        padded = data.select("response_mask", "advantages", core_losses.POLICY_LOSS_MASK_KEY).to_padded_tensor()
        seen.append(dict(response_mask=padded["response_mask"].cpu(), advantages=padded["advantages"].detach().cpu(),
                         keep=padded[core_losses.POLICY_LOSS_MASK_KEY].bool().cpu()))
        return orig_loss(config, model_output, data, dp_group)

    def recording_get_policy_loss_fn(loss_mode):  # ... and the denominator its policy-gradient term divides by
        policy_loss_fn = orig_get_policy_loss_fn(loss_mode)

        def recording(**kw):
            seen[-1]["pg_batch_num_tokens"] = kw["config"].global_batch_info["batch_num_tokens"]
            return policy_loss_fn(**kw)

        return recording

    core_losses.ppo_loss, core_losses.get_policy_loss_fn = recording_loss, recording_get_policy_loss_fn
    grads = []
    orig_step = type(engine).optimizer_step

    def capturing_step():
        grads.extend(p.main_grad.detach().clone() for chunk in engine.module for p in chunk.parameters())
        return orig_step(engine)

    engine.optimizer_step = capturing_step
    before = export_hf(engine)
    try:
        output = run_train_batch(engine, td, cfg)
    finally:
        core_losses.ppo_loss, core_losses.get_policy_loss_fn = orig_loss, orig_get_policy_loss_fn
        del engine.optimizer_step
    after = export_hf(engine)
    grad_hf = export_grads(engine, grads)
    src = engine.is_mp_src_rank_with_outputs()
    metrics = {} if output is None else {k: (v.values if hasattr(v, "values") else v)
                                         for k, v in tu.get(output, "metrics").items()}
    gathered = [None] * dist.get_world_size()  # metrics and loss inputs live on each DP group's output rank
    dist.all_gather_object(gathered, (dp_rank, metrics, seen) if src else None)
    gathered = sorted(g for g in gathered if g is not None)
    return dict(metrics=[m for _, m, _ in gathered], seen=[s for _, _, s in gathered], grads=grad_hf,
                before=before, after=after,
                batch_num_tokens=int(tu.get_non_tensor_data(td, "batch_num_tokens", -1)),
                n_micro_batches=int(tu.get_non_tensor_data(td, "num_micro_batch", -1)))


def _local_spec_without_te():
    """On a GPU without Transformer Engine: Megatron-Core's local spec via the device-neutral CPU-backend shims."""
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        from stapo_verl.cpu.megatron_shims import core

        if WEIGHTS == "bridge":  # Transformer Engine's names for Megatron-Bridge's import, then its local spec
            from stapo_verl.cpu.megatron_shims import megatron_bridge, te_names

            te_names.install()
            megatron_bridge._local_layer_spec()
        else:
            from stapo_verl.cpu.megatron_shims import bridge

            bridge.install()
        core._thd_attention()
        core._no_fused_softmax()


def main(out_path, model_dir, tp, pp):
    torch.set_num_threads(1)
    if DEVICE == "cpu":
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
        _local_spec_without_te()
    rank = dist.get_rank()
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_name
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    import verl.workers.engine_workers as engine_workers

    from stapo_verl.core import losses as core_losses

    engine = build_engine(model_dir, tp, pp)
    dp_rank, dp_size = engine.get_data_parallel_rank(), engine.get_data_parallel_size()
    report = {"device": get_device_name(), "dp_size": dp_size, "engine": type(engine).__name__,
              "bridge": f"{type(engine.bridge).__module__}.{type(engine.bridge).__name__}",
              "wrapped": bool(getattr(engine_workers.TrainingWorker.train_batch, "__stapo_integration__", False))}

    # 1. old-policy pass (infer_batch, calculate_entropy=True), every DP rank on its share
    td = dp_shard(make_batch(), dp_rank, dp_size)
    tu.assign_non_tensor(td, calculate_entropy=True)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)
    if engine.is_mp_src_rank_with_outputs():
        mo = out["model_output"]
        local = (response_from_nested(mo["log_probs"], td["response_mask"]).cpu(),
                 response_from_nested(mo["entropy"], td["response_mask"]).cpu())
    else:
        local = None
    # collect the DP shares from each DP group's output rank (last PP stage, TP rank 0)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (dp_rank, local))
    shares = dict((r, v) for r, v in gathered if v is not None)
    width = max(int(shares[r][0].offsets().diff().max()) for r in range(dp_size))

    def pad(t):  # DP shards pad to their own longest response: widen to the mini-batch's
        return torch.nn.functional.pad(t.to_padded_tensor(0.0), (0, width - int(t.offsets().diff().max())))

    old_lp = torch.cat([pad(shares[r][0]) for r in range(dp_size)])
    ent = torch.cat([pad(shares[r][1]) for r in range(dp_size)])
    report["infer_log_probs"], report["infer_entropy"] = old_lp, ent

    # 2. two optimizer steps on the same mini-batch: loss_mode=stapo on the initial weights, then gspo + the S2T
    #    mask on the updated ones (one job per layout covers both)
    full = make_batch()
    adv = torch.tensor([1.3, 0.8, -0.5, 1.1, 0.9, 1.4, -1.0, 0.6])[:, None].expand(BS, 7).contiguous()
    full["old_log_probs"] = response_to_nested(old_lp, full["response_mask"])
    full["entropy"] = response_to_nested(ent, full["response_mask"])
    full["advantages"] = response_to_nested(adv, full["response_mask"])
    report["n_valid"] = int(full["loss_mask"].values().sum())
    report["rows"] = [(p, r) for p, r in zip(full["prompts"].unbind(), full["responses"].unbind())]
    for route, _, _ in ROUTES:
        report[route] = train_step(engine, full, route, dp_rank, dp_size)
    pairs = int(os.environ.get("STAPO_JOB_TIMED_PAIRS", "0"))  # benchmarks/gpu_check.sh: STAPO vs vanilla step time
    if pairs:
        report["timed_pairs"] = timed_pairs(engine, full, pairs, dp_rank, dp_size)
    if rank == 0:
        torch.save(report, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
