#!/usr/bin/env bash
# The project's dependencies that the GPU image lacks, as wheels to carry to the device machine (its Python 3.12 has
# its own torch 2.11 + CUDA, lightning, onnx, onnxruntime, numpy, scikit-image...: docs/training.md, "GPUs").
# Usage: benchmarks/gpu_wheels.sh [FOLDER]   (default .whl, which .git/info/exclude should ignore)
# There: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src:.
set -euo pipefail
folder=${1:-.whl}
# pydantic (the params schema) is all the training, resume, DDP and export items need. The serve item needs mlflow,
# whose closure (flask, sqlalchemy, alembic, opentelemetry, databricks-sdk, ... ~40 packages) is not resolved here:
# without it that item says "skip: mlflow not importable". Versions as this venv has them.
names=(pydantic pydantic-core annotated-types typing-inspection)
pins=()
for name in "${names[@]}"; do
  pins+=("$name==$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$folder" "${pins[@]}"
du -sh "$folder"
