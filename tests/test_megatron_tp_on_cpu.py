"""Megatron path at TP = 2 on gloo processes against an unsharded reference.

Exercised (megatron-core 0.16.1 on CPU): ``parallel_state`` TP groups, verl's ``vocab_parallel_entropy`` and
Megatron's vocab-parallel cross-entropy (``vocab_parallel_log_probs_from_logits``), and verl's real
``MegatronEngineWithLMHead._lm_head_logits_processor`` with our wrapper installed.
The whole engine (``GPTModel`` forward/backward, pipeline schedules, optimizer) at TP=2 / PP=2 / DP=2 on the CPU is
covered by ``test_megatron_engine_on_cpu.py``; this file isolates the logits processor's TP maths.
"""

import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

V, TP = 12, 2


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(full, labels, temp):
    scaled = full / temp.unsqueeze(-1)
    logp_all = torch.log_softmax(scaled, -1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return ent, logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _worker(rank, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHDYNAMO_DISABLE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    from megatron.core import parallel_state as mpu

    mpu.initialize_model_parallel(tensor_model_parallel_size=TP)
    import verl.workers.engine.megatron.transformer_impl as meg

    from stapo_verl import state
    from stapo_verl.megatron.entropy import vocab_parallel_entropy_no_grad

    g = torch.Generator().manual_seed(0)
    full = torch.randn(1, 9, V, generator=g) * 3  # (1, total_nnz, V) as verl's THD layout
    full[0, 4] = torch.tensor([25.0] + [0.0] * (V - 1))  # a confident position
    labels = torch.randint(0, V, (1, 9), generator=g)
    temp = torch.full((1, 9), 0.7)
    lo, hi = rank * V // TP, (rank + 1) * V // TP
    ref_ent, ref_lp = _reference(full, labels, temp)
    res = {}
    # 1. our gradient-free entropy: unchunked, token-chunked (3-D and 2-D inputs) == unsharded reference
    shard = full[..., lo:hi].clone()
    for chunk in (None, 2, 4):
        res[f"ent_chunk_{chunk}"] = vocab_parallel_entropy_no_grad(shard, temp, chunk_size=chunk)
    res["ent_2d"] = vocab_parallel_entropy_no_grad(shard[0], temp[0], chunk_size=2)
    res["shard_untouched"] = torch.equal(shard, full[..., lo:hi])
    # 2. verl's real logits processor, with and without the STAPO wrapper active
    fake_self = SimpleNamespace(engine_config=SimpleNamespace(entropy_from_logits_with_chunking=False,
                                                              entropy_from_logits_chunk_size=2))
    kw = dict(calculate_sum_pi_squared=False, calculate_entropy=True, distillation_use_topk=False,
              distillation_only=False, logits_processor_func=None, batch=None, data_format="thd")
    proc = meg.MegatronEngineWithLMHead._lm_head_logits_processor
    res["wrapped"] = bool(getattr(proc, "__stapo_wrapped__", False))
    for active in (True, False):
        logits = full[..., lo:hi].clone().requires_grad_(True)
        x = logits * 1.0  # verl divides in place: keep the leaf intact for .grad
        state.MINIBATCH.start(None, detached_entropy=active)
        try:
            out = proc(fake_self, x, labels.clone(), temp.clone(), **kw)
        finally:
            state.MINIBATCH.end()
        out["log_probs"].sum().backward()
        res[f"active_{active}"] = dict(ent=out["entropy"].detach(), ent_grad=out["entropy"].requires_grad,
                                       lp=out["log_probs"].detach(), grad=logits.grad.clone())
    # reference gradient of Σ log p w.r.t. this rank's shard of the (unscaled) logits
    ref_logits = full.clone().requires_grad_(True)
    _reference(ref_logits, labels, temp)[1].sum().backward()
    res["ref_grad"] = ref_logits.grad[..., lo:hi]
    res["ref_ent"], res["ref_lp"] = ref_ent, ref_lp
    torch.save(res, f"{out_path}.{rank}")
    dist.destroy_process_group()


def test_tp2_entropy_and_log_probs_match_unsharded_reference(tmp_path):
    out = str(tmp_path / "tp")
    mp.spawn(_worker, args=(_free_port(), out), nprocs=TP, join=True)
    for rank in range(TP):
        r = torch.load(f"{out}.{rank}", weights_only=False)
        assert r["wrapped"] and r["shard_untouched"]
        for chunk in (None, 2, 4):
            torch.testing.assert_close(r[f"ent_chunk_{chunk}"], r["ref_ent"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["ent_2d"], r["ref_ent"][0], rtol=1e-5, atol=1e-5)
        on, off = r["active_True"], r["active_False"]
        assert on["ent_grad"] is False and off["ent_grad"] is True  # ours is gradient-free; verl's carries grad
        for o in (on, off):
            torch.testing.assert_close(o["ent"], r["ref_ent"], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(o["lp"], r["ref_lp"], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(o["grad"], r["ref_grad"], rtol=1e-5, atol=1e-6)


def test_temperature_shape_is_checked():
    from stapo_verl.megatron.entropy import vocab_parallel_entropy_no_grad

    with pytest.raises(ValueError, match="temperature shape"):
        vocab_parallel_entropy_no_grad(torch.zeros(2, 3, 4), torch.ones(3))


def test_block_causal_mask_is_causal_within_and_blind_across_packed_sequences():
    from stapo_verl.cpu.megatron.core import block_causal_mask

    m = block_causal_mask(torch.tensor([0, 2, 5]), 6)[0, 0]  # sequences [0,1], [2,3,4], and padding token 5
    allowed = ~m
    expected = torch.zeros(6, 6, dtype=torch.bool)
    for lo, hi in ((0, 2), (2, 5), (5, 6)):
        for i in range(lo, hi):
            expected[i, lo: i + 1] = True
    assert torch.equal(allowed, expected)


def test_local_spec_norm_names_map_onto_mbridge_te_names():
    from stapo_verl.cpu.megatron.bridge import local_to_te_name

    assert local_to_te_name("decoder.layers.3.input_layernorm.weight") == (
        "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight")
    assert local_to_te_name("decoder.layers.0.pre_mlp_layernorm.weight") == (
        "decoder.layers.0.mlp.linear_fc1.layer_norm_weight")
    assert local_to_te_name("decoder.final_layernorm.weight") == "decoder.final_layernorm.weight"


_SHIM_PROBE = r"""
import sys, torch
import verl  # the plugin's entry point: CPU platform + post-import hooks
before = sorted(m for m in ("mbridge",) if m in sys.modules)
import verl.workers.engine.megatron.transformer_impl as meg
import megatron.core.tensor_parallel.layers as layers, megatron.core.pipeline_parallel.schedules as sched
import verl.utils.torch_functional as vf
from stapo_verl.cpu.megatron import core, install_hooks, torch_proxy
from verl.workers.engine.base import EngineRegistry
proxy = torch_proxy.TORCH_ON_CPU
assert layers.torch is proxy and sched.torch is proxy and vf.torch is torch  # only megatron's modules
assert proxy.cuda.current_device() == torch.device("cpu") and proxy.zeros(1, device="cuda").device.type == "cpu"
try:
    torch.cuda.current_device()
    raise SystemExit("torch.cuda was patched globally")
except (AssertionError, RuntimeError):
    pass
assert torch.Tensor.type is core._REAL_TYPE and torch.zeros(1).type() == "torch.FloatTensor"  # scoped only
fwd = meg.MegatronEngineWithLMHead
assert EngineRegistry._engines["language_model"]["megatron"]["cpu"] is fwd
import megatron.core.transformer.dot_product_attention as dpa
f = dpa.DotProductAttention.forward
install_hooks(); core.install()  # idempotent
assert dpa.DotProductAttention.forward is f and layers.torch is proxy
import mbridge.core.llm_bridge as lb
assert getattr(lb.get_gpt_decoder_block_spec, "_stapo_cpu", False)
print("OK", before)
"""


def test_cpu_megatron_shims_are_lazy_scoped_and_idempotent():
    """Under VERL_PLATFORM=cpu the shims arrive with verl's Megatron engine import (``verl/workers/engine/__init__.py``
    imports it whenever megatron-core is installed) and mbridge's with mbridge's (not with ``import verl``); they
    rebind ``torch`` only inside megatron-core's modules, leave ``torch.cuda``/``Tensor.type`` alone, and re-applying
    them changes nothing."""
    import subprocess
    import sys

    env = dict(os.environ, VERL_PLATFORM="cpu", TORCHDYNAMO_DISABLE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _SHIM_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "OK []" in proc.stdout  # mbridge is not imported by `import verl` itself
