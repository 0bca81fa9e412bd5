#!/usr/bin/env bash
# The GPU paths checked and measured on a GPU host (docs/training.md, "GPUs"): `bash benchmarks/gpu_session.sh [DIR]`
# from the repository, after benchmarks/gpu_wheels.sh where the host has no network access. gpu_check's every item;
# its serve item again with mlflow's wheels on the path (that item's only: they would shadow the host's own
# packages); then gpu_speed in what is left of SECONDS_BUDGET. Results go to DIR, else benchmarks/results.
set -uo pipefail
out=${1:-benchmarks/results}
budget=${SECONDS_BUDGET:-560}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/site-mlflow .whl/mlflow/*.whl
# Absolute: the served model's server starts in a folder of its own.
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
timeout 330 python3 -m benchmarks.gpu_check --out "$out" 2>&1 | tee "$out/check.log"
PYTHONPATH=/tmp/site:/tmp/site-mlflow:$PWD/src:$PWD timeout 150 python3 -m benchmarks.gpu_check --out "$out" \
  --items "train 16-mixed" "export + onnxruntime parity" "serve + client example" 2>&1 | tee "$out/serve.log"
left=$((budget - SECONDS))
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 -m benchmarks.gpu_speed --out "$out" --no-compile 2>&1 | tee "$out/speed.log"
fi
