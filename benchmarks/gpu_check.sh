#!/usr/bin/env bash
# Issue 8 item 5: the one short GPU check (never part of CI). Run once on a CUDA machine from the repository root:
#   bash benchmarks/gpu_check.sh            # writes $OUT (default outputs/gpu_check/) and prints the numbers
# Needs a CUDA torch 2.13 with verl 0.9.1, megatron-core 0.16.1, mbridge 0.15.1, einops (wheels may be carried in
# WHEELS=dir and are installed with --no-deps first). Two parts, each with its own time limit:
#   1. benchmarks/bench_loss.py --device cuda (bf16): STAPO's loss vs verl's vanilla loss, interleaved pairs.
#   2. verl's MegatronEngineWithLMHead train_batch with loss_mode=stapo at TP=1 on cuda (bf16, mbridge,
#      tests/integration/core/megatron_engine_job.py with STAPO_JOB_DEVICE=cuda): every route the job runs, loss /
#      grad norm / wall time.
#      Without Transformer Engine it uses Megatron-Core's local spec through the device-neutral shims of
#      stapo_verl.cpu.megatron_shims (local layer spec in mbridge, packed-THD attention mask, no fused softmax kernel).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-python}"
OUT="${OUT:-outputs/gpu_check}"
mkdir -p "$OUT"
if [[ -n ${WHEELS:-} ]]; then
    "$PY" -m pip install -q --no-deps "$WHEELS"/*.whl
fi
"$PY" - <<'PY'
import torch, verl, megatron.core, mbridge  # noqa: F401
assert torch.cuda.is_available(), "no CUDA device"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("verl", verl.__version__, "megatron-core", megatron.core.__version__)
PY
unset VERL_PLATFORM
export TORCHDYNAMO_DISABLE=1 PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

echo "== 1. bench_loss.py --device cuda --dtype bf16"
timeout 300 "$PY" benchmarks/bench_loss.py --device cuda --dtype bf16 --pairs 6 | tee "$OUT/bench_loss.txt"

echo "== 2. Megatron engine train_batch, loss_mode=stapo, TP=1, cuda bf16"
timeout 400 "$PY" - "$OUT" <<'PY'
import sys, time
from pathlib import Path
import torch
from support.megatron_launch import make_model_dir, run_job

out = Path(sys.argv[1])
model_dir = make_model_dir(out / "model")
t0 = time.perf_counter()
run_job(out / "tp1_cuda.pt", model_dir, 1, 1, 1, timeout=360, extra_env={"STAPO_JOB_DEVICE": "cuda", "VERL_PLATFORM": ""})
wall = time.perf_counter() - t0
r = torch.load(out / "tp1_cuda.pt", weights_only=False)
print("device", r["device"], "engine", r["engine"], "wall_s", round(wall, 1))
for route, s in r.items():
    if not (isinstance(s, dict) and "metrics" in s):
        continue
    m = s["metrics"][0]
    after, before = s.get("after", {}), s.get("before", {})
    changed = sum(not torch.equal(after[k], before[k]) for k in after if k in before)
    print(route, "pg_loss", sum(m["actor/pg_loss"]), "grad_norm", m["grad_norm"],
          "num_masked", m.get("actor/stapo/num_masked"), "weights changed", changed, "/", len(after),
          "verl entropy calls", s.get("verl_entropy_calls"))
PY
