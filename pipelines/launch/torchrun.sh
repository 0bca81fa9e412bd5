#!/usr/bin/env bash
# Multi-node training with torchrun: run this same command on every node, from the project folder (the one with
# params.yaml), with the project's venv activated. Every node must see the same data/cache and the same checkpoints/:
# a shared file system, or copies of node 0's folders (only rank 0 writes checkpoints; a node whose checkpoints/
# disagrees with node 0's stops the job before its first step, naming what each node found):
#   NNODES=2 NPROC_PER_NODE=4 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 pipelines/launch/torchrun.sh [--set k=v ...]
# Lightning sees torchrun's environment (TorchElasticEnvironment) and builds DDP over NNODES x NPROC_PER_NODE
# processes; train.num_nodes/train.devices are set to match, so the global batch is split correctly.
# On CPU (gloo) pass `--set train.accelerator=cpu`; on GPUs NCCL is used. Point MLFLOW_TRACKING_URI at a tracking
# server when the nodes do not share this folder. A stopped run (SIGTERM, Ctrl-C, a lost node) continues from
# checkpoints/last.ckpt when started again.
# When the job has trained a model, node 0 records it as the train stage's output (pipelines/launch/record.py: the
# settings go into params.yaml, `dvc commit train`), so the next `dvc repro` evaluates, exports and registers it.
set -euo pipefail
: "${NNODES:=1}" "${NPROC_PER_NODE:=1}" "${NODE_RANK:=0}" "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
settings=(--set "train.num_nodes=$NNODES" --set "train.devices=$NPROC_PER_NODE" "$@")
launch="$(dirname "$0")"
torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$launch/../train.py" "${settings[@]}"
if [ "$NODE_RANK" = 0 ] && [ -f dvc.yaml ]; then
  python "$launch/record.py" "${settings[@]}"
fi
