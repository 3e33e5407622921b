#!/usr/bin/env bash
# GENERATED from [serve] in manifest.toml by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: GB10_MODEL=/path/to/model serve.sh [gb10]
# Reads: GB10_MODEL (required), GB10_SEQS, HOST, PORT, CUDA_VISIBLE_DEVICES,
#        PYTHON (the engine's interpreter), GB10_PROFILE (default gb10).
set -euo pipefail
profile="${1:-${GB10_PROFILE:-gb10}}"
: "${GB10_MODEL:?set GB10_MODEL to the model directory}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
PYTHON="${PYTHON:-python3}"
export CUDA_DEVICE_ORDER=PCI_BUS_ID
case "$profile" in
  gb10)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GB10_MODEL" \
      --host "$HOST" --port "$PORT" \
      --trust-remote-code \
      --gpu-memory-utilization 0.85 \
      --tensor-parallel-size 1 \
      --max-model-len 65536 \
      --max-num-seqs "${GB10_SEQS:-1}" \
      --speculative-config '{"method":"mtp","num_speculative_tokens":2,"draft_sample_method":"greedy"}'
    ;;
  *)
    echo "unknown profile '$profile' (known: gb10)" >&2
    exit 2
    ;;
esac
