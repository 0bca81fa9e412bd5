#!/usr/bin/env bash
# The project's dependencies that a GPU host without network access lacks, as wheels to carry there, for a host whose
# Python 3.12 has its own torch + CUDA, lightning, onnx, onnxruntime, numpy, scikit-image (docs/training.md, "GPUs").
# Usage: benchmarks/gpu_wheels.sh [FOLDER]   (default .whl, which git ignores)
# There: bash benchmarks/gpu_session.sh DIR (the check, its serve item with mlflow, then gpu_speed in the time left).
set -euo pipefail
folder=${1:-.whl}
# pydantic (the params schema) is all the training, resume, DDP and export items need; versions as this venv has them.
names=(pydantic pydantic-core annotated-types typing-inspection)
pins=()
for name in "${names[@]}"; do
  pins+=("$name==$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')")
done
where=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps "${where[@]}" -d "$folder" "${pins[@]}"
# The serve item's mlflow with its closure, in a folder of its own (benchmarks/gpu_session.sh puts it on the path for
# that item only, so it shadows none of the image's packages elsewhere), less what the image has or serving never
# imports.
mlflow="mlflow==$(.venv/bin/python -m pip show mlflow | sed -n 's/^Version: //p')"
python3 -m pip download -q "${where[@]}" -d "$folder/mlflow" "$mlflow"
for name in numpy scipy pillow protobuf packaging typing_extensions pyarrow matplotlib contourpy kiwisolver fonttools \
  pyparsing cycler scikit_learn joblib threadpoolctl skops "${names[@]//-/_}"; do
  rm -f "$folder/mlflow/$name"-[0-9]*.whl
done
du -sh "$folder" "$folder/mlflow"
