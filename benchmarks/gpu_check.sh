#!/usr/bin/env bash
# The one short GPU check, on the GPU image's production stack (never part of CI; at most 10 minutes). From the
# repository root on a CUDA machine with Python 3.12 and torch 2.11 (the image's: 2.11.0+cu130):
#   bash benchmarks/gpu_check.sh                    # prints the numbers, writes $OUT (default outputs/gpu_check/)
#   bash benchmarks/gpu_check.sh --fetch-wheels DIR # on a machine with PyPI: the wheels the check needs, for a GPU
#                                                   # machine without network (then WHEELS=DIR there)
#
# What it needs beyond torch: the production route's pure-Python packages, pinned as the image pins them
# (docker/Dockerfile): verl 0.9.1, megatron-core 0.18.0, Megatron-Bridge 0.5.1, nvidia-modelopt 0.44.0, transformers
# 5.9.0, TransferQueue 0.1.11, tensordict 0.10.0, and this package. Already importable packages are used as they are;
# WHEELS=dir is installed first with `pip install --no-deps --no-index` (at most 64 MiB in all: the limit of what
# travels to a lent GPU machine; the check refuses a larger directory). --fetch-wheels downloads the pinned ones
# (Python 3.12, manylinux x86_64, --no-deps) and prints their total size (17 MiB with this package); dependencies the
# GPU machine lacks (ray, pandas, pyarrow, ... verl's own) must be added the same way or be there already.
#
# What cannot travel in 64 MiB and is therefore not run: vLLM 0.24 (a CUDA wheel of hundreds of MB) and Transformer
# Engine (a source build). Without Transformer Engine, part 2 builds Megatron-Core's local layer spec through the
# CPU platform's device-neutral shims (stapo_verl.cpu.megatron_shims: Transformer Engine's names for Megatron-Bridge's
# import, Megatron-Bridge's local spec, packed-THD attention mask, no fused softmax kernel), not the image's TE spec;
# with Transformer Engine importable it uses the TE spec, as the recipes do. No rollout, no weight sync to vLLM.
#
#   1. benchmarks/bench_loss.py --device cuda --dtype bf16: STAPO's loss path vs verl's vanilla loss at the 8B
#      output-layer shape, interleaved subprocess pairs, median ratio.
#   2. verl 0.9.1's MegatronEngineWithLMHead on cuda in bf16 through verl's default weight path, Megatron-Bridge
#      (tests/integration/core/megatron_engine_job.py, STAPO_JOB_DEVICE=cuda STAPO_JOB_WEIGHTS=bridge): the HF load,
#      the old-policy pass, the plugin's train_batch with loss_mode=stapo and gspo + S2T, verl's per-tensor export,
#      then STAPO_JOB_TIMED_PAIRS interleaved stapo / vanilla optimizer steps on the same mini-batch in the same
#      process: the step-time ratio stapo/vanilla (median and range of the pairs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-python3}"
OUT="${OUT:-outputs/gpu_check}"
PAIRS="${PAIRS:-8}"
PINS=(verl==0.9.1 megatron-core==0.18.0 megatron-bridge==0.5.1 nvidia-modelopt==0.44.0 transformers==5.9.0
    TransferQueue==0.1.11 tensordict==0.10.0)
LIMIT_BYTES=$((64 * 1024 * 1024))

if [[ ${1:-} == --fetch-wheels ]]; then
    dir="${2:?--fetch-wheels DIR}"
    mkdir -p "$dir"
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        -d "$dir" "${PINS[@]}"
    "$PY" -m pip wheel --no-deps -w "$dir" .
    total=$(du -cb "$dir"/*.whl | tail -n 1 | cut -f1)
    echo "[gpu_check] $dir: $((total / 1024 / 1024)) MiB of wheels (limit 64 MiB)"
    exit 0
fi

if [[ -n ${WHEELS:-} ]]; then
    total=$(du -cb "$WHEELS"/*.whl | tail -n 1 | cut -f1)
    if ((total > LIMIT_BYTES)); then
        echo "[gpu_check] WHEELS=$WHEELS holds $((total / 1024 / 1024)) MiB; at most 64 MiB travels" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-deps --no-index "$WHEELS"/*.whl
fi
mkdir -p "$OUT"

"$PY" - "${PINS[@]}" <<'PY'
import importlib.metadata as m
import sys

import torch

assert sys.version_info[:2] == (3, 12), f"Python {sys.version.split()[0]}: the image's is 3.12"
assert torch.__version__.split("+")[0] == "2.11.0", f"torch {torch.__version__}: the image's is 2.11.0"
assert torch.cuda.is_available(), "no CUDA device"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
wrong = []
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        got = m.version(name)
    except m.PackageNotFoundError:
        got = None
    print(f"{name} {got}")
    if got != want:
        wrong.append(f"{name}: {got} (want {want})")
assert not wrong, f"not the image's versions: {wrong}; install them (WHEELS=dir, see --fetch-wheels)"
for name in ("transformer_engine", "vllm", "flash_attn"):
    try:
        __import__(name)
        print(name, "importable")
    except ImportError:
        print(name, "not installed: not run by this check")
from stapo_verl.cpu.megatron_shims import te_names  # noqa: E402

te_names.install()  # inert where Transformer Engine is importable
from megatron.bridge import AutoBridge  # noqa: F401,E402  (and modelopt: the production route's imports)

print("megatron.bridge.AutoBridge importable")
PY
unset VERL_PLATFORM
export TORCHDYNAMO_DISABLE=1 PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

echo "== 1. bench_loss.py --device cuda --dtype bf16"
timeout 240 "$PY" benchmarks/bench_loss.py --device cuda --dtype bf16 --pairs 6 | tee "$OUT/bench_loss.txt"

echo "== 2. Megatron engine through Megatron-Bridge, TP=1, cuda bf16: routes, then $PAIRS stapo/vanilla step pairs"
timeout 300 "$PY" - "$OUT" "$PAIRS" <<'PY'
import statistics
import sys
import time
from pathlib import Path

import torch
from support.megatron_launch import make_model_dir, run_job

out, pairs = Path(sys.argv[1]), sys.argv[2]
model_dir = make_model_dir(out / "model")
t0 = time.perf_counter()
run_job(out / "tp1_cuda.pt", model_dir, 1, 1, 1, timeout=280,
        extra_env={"STAPO_JOB_DEVICE": "cuda", "VERL_PLATFORM": "", "STAPO_JOB_WEIGHTS": "bridge",
                   "STAPO_JOB_TIMED_PAIRS": pairs})
wall = time.perf_counter() - t0
r = torch.load(out / "tp1_cuda.pt", weights_only=False)
print("device", r["device"], "engine", r["engine"], "bridge", r["bridge"], "wall_s", round(wall, 1))
for route in ("old_policy", "gspo"):
    s = r[route]
    m = s["metrics"][0]
    changed = sum(not torch.equal(s["after"][k], s["before"][k]) for k in s["after"] if k in s["before"])
    print(route, "pg_loss", sum(m["actor/pg_loss"]), "grad_norm", m["grad_norm"],
          "num_masked", m.get("actor/stapo/num_masked"), "weights changed", changed, "/", len(s["after"]))
t = r["timed_pairs"]
ratios = sorted(t["ratios"][1:])  # the first pair includes the first-step warm-up of both variants
print(f"step time stapo/vanilla: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}, "
      f"{len(ratios)} pairs); vanilla median {statistics.median(t['vanilla'][1:]) * 1e3:.1f} ms")
PY
