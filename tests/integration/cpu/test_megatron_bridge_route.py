"""verl's default Megatron weight path, Megatron-Bridge (``megatron.vanilla_mbridge=False``), on the GPU image's stack.

The environment is ``STAPO_STACK=bridge`` (``.venv-bridge``: Python 3.12, torch 2.11.0, megatron-core 0.18.0,
Megatron-Bridge 0.5.1, nvidia-modelopt 0.44.0, transformers 5.9.0); the test creates it on first use. In it, the
Megatron engine job (``tests/integration/core/megatron_engine_job.py`` with ``STAPO_JOB_WEIGHTS=bridge``) runs verl
0.9.1's real ``MegatronEngineWithLMHead`` over gloo at TP=1 and TP=2 in fp32 with the distributed optimizer: verl
builds the model with ``AutoBridge.from_hf_pretrained`` → ``to_megatron_provider`` → ``apply_overrides_and_finalize``
→ ``provide_distributed_model``, loads the HF weights with ``load_hf_weights``, and exports them with
``get_per_tensor_param`` (Megatron-Bridge's ``export_hf_weights``, what verl sends to the rollout at every sync).

Checked: the engine's bridge is Megatron-Bridge's ``AutoBridge``; the export of the loaded weights is the HF checkpoint
itself (every tensor, exactly); old-policy log-probs and entropy match an unsharded HF-transformers forward of those
weights in this (default) environment's torch and transformers; ``loss_mode=stapo`` and ``gspo`` + S2T train steps at
TP=2 give TP=1's mask counts, loss, grad norm and updated weights.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from support.megatron_launch import hf_model, make_model_dir, reference, run_job
from support.procs import REPO

LAYOUTS = {"tp1": (1, 1), "tp2": (2, 2)}  # name: (tp, world)


@pytest.fixture(scope="module")
def bridge_python():
    venv = subprocess.run(["bash", str(REPO / "scripts" / "setup_env.sh")], capture_output=True, text=True,
                          env={**os.environ, "STAPO_STACK": "bridge", "STAPO_VENV": ""}, timeout=1800)
    assert venv.returncode == 0, venv.stderr[-3000:]
    return os.path.join(venv.stdout.strip().splitlines()[-1], "bin", "python")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bridge_python):
    root = tmp_path_factory.mktemp("bridge")
    out = {"model_dir": make_model_dir(root / "model")}
    for name, (tp, world) in LAYOUTS.items():
        run_job(root / f"{name}.pt", out["model_dir"], tp, 1, world, python=bridge_python,
                extra_env={"STAPO_JOB_WEIGHTS": "bridge", "STAPO_VENV": ""})
        out[name] = torch.load(root / f"{name}.pt", weights_only=False)
    return out


def test_the_stack_is_the_images(bridge_python):
    code = ("import sys, importlib.metadata as m; print(sys.version_info[:2], [m.version(p) for p in "
            "('torch', 'megatron-core', 'megatron-bridge', 'nvidia-modelopt', 'transformers', 'verl')])")
    out = subprocess.run([bridge_python, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "(3, 12) ['2.11.0', '0.18.0', '0.5.1', '0.44.0', '5.9.0', '0.9.1']", out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_megatron_bridge_loads_and_exports_the_hf_weights_exactly(runs, layout):
    r = runs[layout]
    assert r["bridge"] == "megatron.bridge.models.conversion.auto_bridge.AutoBridge" and r["device"] == "cpu"
    hf = load_file(runs["model_dir"] / "model.safetensors")
    exported = r["old_policy"]["before"]
    assert exported.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(exported[name], tensor.float()), name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_old_policy_pass_matches_an_unsharded_hf_forward(runs, layout):
    r = runs[layout]
    model = hf_model(runs["model_dir"], r["old_policy"]["before"])
    for j, (prompt, response) in enumerate(r["rows"]):
        ent, lp = reference(model, prompt, response, 1.0)
        torch.testing.assert_close(r["infer_log_probs"][j, : len(response)].double(), lp, atol=5e-6, rtol=0)
        torch.testing.assert_close(r["infer_entropy"][j, : len(response)].double(), ent, atol=5e-6, rtol=0)


@pytest.mark.parametrize("route", ["old_policy", "gspo"])
def test_tp2_train_steps_match_tp1(runs, route):
    a, b = runs["tp1"][route], runs["tp2"][route]
    assert a["batch_num_tokens"] == b["batch_num_tokens"] > 0
    ma, mb = a["metrics"][0], b["metrics"][0]
    for key in ("actor/stapo/num_masked", "actor/stapo/num_candidates"):
        assert ma[key] == mb[key], key
    assert ma["actor/stapo/num_candidates"] > 0  # the mask had something to decide
    for key in ("actor/pg_loss", "grad_norm"):
        torch.testing.assert_close(torch.tensor(mb[key]).double(), torch.tensor(ma[key]).double(), atol=1e-5,
                                   rtol=1e-5, msg=key)
    assert a["after"].keys() == b["after"].keys()
    moved = 0.0
    for k in a["after"]:
        torch.testing.assert_close(b["after"][k], a["after"][k], atol=2e-6, rtol=1e-5, msg=k)
        moved = max(moved, float((a["after"][k] - a["before"][k]).abs().max()))
    assert moved > 1e-4  # the optimizer step changed the weights
