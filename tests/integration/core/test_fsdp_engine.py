"""verl's FSDP2 engine ``train_batch`` in one CPU process (gloo) on the packaged CPU platform, with STAPO.

The job (``fsdp_engine_job.py``) runs in a fresh interpreter with ``VERL_PLATFORM=cpu`` so the plugin's entry point
loads ``stapo_verl.cpu`` (platform + engine registration) exactly as in a Ray worker — no test-only shim.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import child_env, free_port


def test_fsdp2_engine_train_batch_runs_stapo_and_updates_weights(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fsdp_engine_job.py")), str(out),
                           str(free_port())], env=child_env(VERL_PLATFORM="cpu"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["device"] == "cpu"
    assert r["n_masked"] > 0 and r["n_candidates"] >= r["n_masked"]
    # the PG term is normalised by the global kept count Σ K (exact renormalisation) in every micro-batch, while
    # loss_mask stays intact and the engine's count (what verl's KL/entropy terms use) is every valid token
    assert len(r["pg_batch_num_tokens"]) == 2  # 4 samples, micro_batch_size_per_gpu=2
    assert all(b == r["n_valid"] - r["n_masked"] for b in r["pg_batch_num_tokens"])
    assert r["batch_num_tokens"] == r["loss_mask_sum"] == r["n_valid"]
    assert r["masked_frac"] == pytest.approx(r["n_masked"] / r["n_valid"])
    assert {"actor/stapo/tau_h", "actor/stapo/num_masked", "actor/pg_loss"} <= set(r["metric_keys"])
    assert r["n_changed"] == r["n_params"] and r["max_change"] > 0  # the optimizer step moved every weight
    assert r["grad_norm"] > 0
    # cispo with and without token_mask=s2t, KL loss and entropy term on, same weights, the engine's own forward:
    # the KL and entropy terms are identical (response_mask, batch_num_tokens); only the PG term changes
    probe = r["kl_probe"]
    assert probe["masked_tokens"] > 0
    assert probe["masked"]["kl_loss"] == probe["plain"]["kl_loss"] != 0
    assert probe["masked"]["actor/entropy_loss"] == probe["plain"]["actor/entropy_loss"] != 0
    assert probe["masked"]["actor/pg_loss"] != probe["plain"]["actor/pg_loss"]
