#!/usr/bin/env bash
# GENERATED from [serve] in manifest.toml by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: SM120_MODEL=/path/to/model serve.sh [tp2]
# Reads: SM120_MODEL (required), SM120_SEQS, HOST, PORT, CUDA_VISIBLE_DEVICES,
#        PYTHON (the engine's interpreter), SM120_PROFILE (default tp2).
set -euo pipefail
profile="${1:-${SM120_PROFILE:-tp2}}"
: "${SM120_MODEL:?set SM120_MODEL to the model directory}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
PYTHON="${PYTHON:-python3}"
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export NCCL_P2P_LEVEL=NVL
case "$profile" in
  tp2)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$SM120_MODEL" \
      --host "$HOST" --port "$PORT" \
      --trust-remote-code \
      --kv-cache-dtype fp8_e4m3 \
      --gpu-memory-utilization 0.92 \
      --tensor-parallel-size 2 \
      --max-model-len 65536 \
      --max-num-seqs "${SM120_SEQS:-4}"
    ;;
  *)
    echo "unknown profile '$profile' (known: tp2)" >&2
    exit 2
    ;;
esac
