#!/usr/bin/env bash
# GENERATED from [serve] in manifest.toml by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: GB10_MODEL=/path/to/model serve.sh [8k|64k]
# Reads: GB10_MODEL (required), GB10_SEQS, PYTHON (the engine's interpreter), HOST, PORT, CUDA_VISIBLE_DEVICES,
#        GB10_PROFILE (default 64k).
set -euo pipefail
profile="${1:-${GB10_PROFILE:-64k}}"
: "${GB10_MODEL:?set GB10_MODEL to the model directory}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
# Values from the environment are checked before they reach the server's flags.
case "$PORT" in
  ''|*[!0-9]*|0*|??????*) echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2 ;;
esac
if [ "$PORT" -gt 65535 ]; then echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2; fi
# known issue (card): stock vLLM cannot load this pack: it has neither the exl3 quantization method nor the Glm5Next architecture
# known issue (card): do not pass --moe-backend marlin
# known issue (card): native MTP: do not mix a DFlash sidecar on the same server
# known issue (card): at 131072 context a 98,304-token prompt faults in the EXL3 fused-MoE path and kills the engine: 65536 stays the recommended serving context
# known issue (card): booted at 262,144, prompts between ~163k and ~180k wedge the engine: keep prompts <= 163k
PYTHON="${PYTHON:-python3}"
case "${GB10_SEQS-1}" in
  ''|*[!0-9]*|0*|??????*) echo "GB10_SEQS=$GB10_SEQS is not a count (1-99999)" >&2; exit 2 ;;
esac
export EXL3_FUSED_MOE=1
case "$profile" in
  8k)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GB10_MODEL" \
      --host "$HOST" --port "$PORT" \
      --served-model-name GLM-5.3-Flash-EXL3 \
      --quantization exl3 \
      --kv-cache-dtype fp8 \
      --gpu-memory-utilization 0.87 \
      --max-num-batched-tokens 2048 \
      --tool-call-parser glm47 \
      --enable-auto-tool-choice \
      --reasoning-parser glm45 \
      --skip-mm-profiling \
      --limit-mm-per-prompt '{"image":4,"video":1}' \
      --tensor-parallel-size 1 \
      --max-model-len 8192 \
      --max-num-seqs "${GB10_SEQS:-1}" \
      --speculative-config '{"method":"mtp","num_speculative_tokens":2}'
    ;;
  64k)
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
    exec "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$GB10_MODEL" \
      --host "$HOST" --port "$PORT" \
      --served-model-name GLM-5.3-Flash-EXL3 \
      --quantization exl3 \
      --kv-cache-dtype fp8 \
      --gpu-memory-utilization 0.91 \
      --max-num-batched-tokens 2048 \
      --tool-call-parser glm47 \
      --enable-auto-tool-choice \
      --reasoning-parser glm45 \
      --skip-mm-profiling \
      --limit-mm-per-prompt '{"image":4,"video":1}' \
      --tensor-parallel-size 1 \
      --max-model-len 65536 \
      --max-num-seqs "${GB10_SEQS:-1}" \
      --speculative-config '{"method":"mtp","num_speculative_tokens":2}'
    ;;
  *)
    echo "unknown profile '$profile' (known: 8k 64k)" >&2
    exit 2
    ;;
esac
