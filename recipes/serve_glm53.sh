#!/usr/bin/env bash
# GENERATED from [serve] in manifest.toml by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: GLM53_MODEL=/path/to/model recipes/serve_glm53.sh [card|card-4users|8gpu]
# Reads: GLM53_MODEL (required), GLM53_SEQS, PYTHON (the engine's interpreter), HOST, PORT, CUDA_VISIBLE_DEVICES,
#        GLM53_PROFILE (default card).
set -euo pipefail
profile="${1:-${GLM53_PROFILE:-card}}"
: "${GLM53_MODEL:?set GLM53_MODEL to the model directory}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
# Values from the environment are checked before they reach the server's flags.
case "$PORT" in
  ''|*[!0-9]*|0*|??????*) echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2 ;;
esac
if [ "$PORT" -gt 65535 ]; then echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2; fi
# known issue (card): keep --max-num-seqs set: the default 256 makes the MLA prefill workspace too big and the server will not start at 131K
# known issue (card): cross-socket PCIe peer-to-peer copies silently returned corrupt data between non-NVLinked pairs; NCCL_P2P_LEVEL=NVL was the fix
# known issue (card): the 2-bit quant loops in long multi-turn agent sessions past ~85K context and corrupts paths and JSON by ~120K
# known issue (card): TP8 is impossible on this EXL3 path (per-rank MoE intermediate must be a multiple of 512, TP8 gives 256); expert parallelism is refused; MTP has no pipeline parallelism
# known issue (card): stock exllamav3 cannot load this checkpoint: the tile order is V100-specific
# known issue (card): MTP tok/s moves with the prompt text: compare builds by ms per pass
PYTHON="${PYTHON:-python3}"
case "${GLM53_SEQS-1}" in
  ''|*[!0-9]*|0*|??????*) echo "GLM53_SEQS=$GLM53_SEQS is not a count (1-99999)" >&2; exit 2 ;;
esac
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export VLLM_USE_V2_MODEL_RUNNER=1
export VLLM_WORKER_MULTIPROC_METHOD=spawn
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
case "$profile" in
  card)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GLM53_MODEL" \
      --host "$HOST" --port "$PORT" \
      --served-model-name glm-5.3-flash \
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
  card-4users)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GLM53_MODEL" \
      --host "$HOST" --port "$PORT" \
      --served-model-name glm-5.3-flash \
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
      --max-num-seqs "${GLM53_SEQS:-4}" \
      --speculative-config '{"method":"mtp","num_speculative_tokens":3,"draft_sample_method":"greedy"}'
    ;;
  8gpu)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}"
    export NCCL_P2P_LEVEL=NVL
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GLM53_MODEL" \
      --host "$HOST" --port "$PORT" \
      --served-model-name glm-5.3-flash \
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
    echo "unknown profile '$profile' (known: card card-4users 8gpu)" >&2
    exit 2
    ;;
esac
