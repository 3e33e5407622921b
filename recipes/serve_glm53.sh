#!/usr/bin/env bash
# GENERATED from [serve] in manifest.toml by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: GLM53_MODEL=/path/to/model recipes/serve_glm53.sh [card|8gpu]
# Reads: GLM53_MODEL (required), GLM53_SEQS, HOST, PORT, CUDA_VISIBLE_DEVICES,
#        PYTHON (the engine's interpreter), GLM53_PROFILE (default card).
set -euo pipefail
profile="${1:-${GLM53_PROFILE:-card}}"
: "${GLM53_MODEL:?set GLM53_MODEL to the model directory}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
PYTHON="${PYTHON:-python3}"
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export VLLM_USE_V2_MODEL_RUNNER=1
export VLLM_WORKER_MULTIPROC_METHOD=spawn
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
case "$profile" in
  card)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GLM53_MODEL" \
      --host "$HOST" --port "$PORT" \
      --trust-remote-code \
      --dtype half \
      --kv-cache-dtype fp8_e4m3 \
      --gpu-memory-utilization 0.92 \
      --max-num-batched-tokens 4096 \
      --reasoning-parser deepseek_r1 \
      --tool-call-parser glm47 \
      --enable-auto-tool-choice \
      --tensor-parallel-size 4 \
      --max-model-len 131072 \
      --max-num-seqs "${GLM53_SEQS:-1}" \
      --speculative-config '{"method":"mtp","num_speculative_tokens":3,"draft_sample_method":"greedy"}'
    ;;
  8gpu)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GLM53_MODEL" \
      --host "$HOST" --port "$PORT" \
      --trust-remote-code \
      --dtype half \
      --kv-cache-dtype fp8_e4m3 \
      --gpu-memory-utilization 0.92 \
      --max-num-batched-tokens 4096 \
      --reasoning-parser deepseek_r1 \
      --tool-call-parser glm47 \
      --enable-auto-tool-choice \
      --tensor-parallel-size 4 \
      --pipeline-parallel-size 2 \
      --max-model-len 1048576 \
      --max-num-seqs "${GLM53_SEQS:-8}"
    ;;
  *)
    echo "unknown profile '$profile' (known: card 8gpu)" >&2
    exit 2
    ;;
esac
