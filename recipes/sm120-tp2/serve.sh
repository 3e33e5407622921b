#!/usr/bin/env bash
# GENERATED from [serve] in manifest.toml by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: SM120_MODEL=/path/to/model serve.sh [daily|accuracy|long500k|fidelity|fidelity-nvfp4]
# Reads: SM120_MODEL (required), the image verdictai/glm53-flash-exl3-k4@sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca (run by docker), HOST, PORT, CUDA_VISIBLE_DEVICES,
#        SM120_PROFILE (default daily).
set -euo pipefail
profile="${1:-${SM120_PROFILE:-daily}}"
: "${SM120_MODEL:?set SM120_MODEL to the model directory}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8012}"
# Values from the environment are checked before they reach the server's flags.
case "$PORT" in
  ''|*[!0-9]*|0*|??????*) echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2 ;;
esac
if [ "$PORT" -gt 65535 ]; then echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2; fi
# known issue (card): not a stock vLLM/ExLlamaV3 compatibility claim: the image carries a dedicated vLLM/B12X overlay
# known issue (card): NVFP4 KV missed the preregistered mean KLD < 0.06 gate on v44 (0.0605); use FP8 KV (the accuracy profile) when KLD fidelity is the priority
# known issue (card): per-token dynamic KV scaling was worse (mean KLD 0.0682) and is disabled in the daily profile
# known issue (card): a 499K request with the 2,048-token chunk asked KPool for 758 MiB with 754 MiB free: use the long500k profile
# known issue (card): 500K was not rebenchmarked after the v71 runtime overlay
# known issue (card): LAVD is not a passing quality gate (4/10 accepted at best)
# known issue (card): the KLD gates were measured eager with MTP disabled, TP2/EP2, DCP2 (v71) or DCP1 (v44), route128 SMEM
case "$profile" in
  daily)
    devices="${CUDA_VISIBLE_DEVICES:-0,1}"
    # the card's serve script: PROFILE=daily (read on the host)
    cache=(); if [ -n "${SM120_CACHE_DIR:-}" ]; then cache=(-v "$SM120_CACHE_DIR":/root/.cache); fi
    exec docker run --rm \
      --gpus "\"device=$devices\"" \
      --init --ipc host \
      --shm-size 32g -v "$SM120_MODEL":/model:ro \
      "${cache[@]}" \
      -e VLLM_ENGINE_READY_TIMEOUT_S=3600 \
      -e VLLM_B12X_GLM_NOPE_NVFP4=1 \
      -e VLLM_USE_B12X_DCP_A2A=1 \
      -e VLLM_B12X_MLA_CKV_GATHER=0 \
      -e OMP_NUM_THREADS=2 \
      -e NCCL_IB_DISABLE=1 \
      -e NCCL_P2P_LEVEL=4 \
      -e NCCL_PROTO=LL,LL128,Simple \
      -p "$HOST:$PORT:$PORT" \
      --entrypoint vllm \
      verdictai/glm53-flash-exl3-k4@sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca serve /model \
      --served-model-name GLM-5.3-Flash-EXL3-4bpw \
      --host 0.0.0.0 \
      --port "$PORT" \
      --language-model-only \
      --tensor-parallel-size 2 \
      --decode-context-parallel-size 2 \
      --dcp-comm-backend a2a \
      --dtype bfloat16 \
      --load-format safetensors \
      --moe-backend b12x \
      --attention-backend B12X_MLA_SPARSE \
      --kv-cache-dtype nvfp4_ds_mla \
      --max-model-len 499968 \
      --max-num-batched-tokens 2048 \
      --max-num-seqs 1 \
      --gpu-memory-utilization 0.986 \
      --enable-chunked-prefill \
      --no-enable-prefix-caching \
      --generation-config /model \
      --reasoning-parser glm45 \
      --disable-custom-all-reduce \
      --speculative-config '{"method":"mtp","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}'
    ;;
  accuracy)
    devices="${CUDA_VISIBLE_DEVICES:-0,1}"
    # the card's serve script: CACHE=fp8_ds_mla (read on the host)
    cache=(); if [ -n "${SM120_CACHE_DIR:-}" ]; then cache=(-v "$SM120_CACHE_DIR":/root/.cache); fi
    exec docker run --rm \
      --gpus "\"device=$devices\"" \
      --init --ipc host \
      --shm-size 32g -v "$SM120_MODEL":/model:ro \
      "${cache[@]}" \
      -e VLLM_ENGINE_READY_TIMEOUT_S=3600 \
      -e VLLM_B12X_GLM_NOPE_NVFP4=1 \
      -e VLLM_USE_B12X_DCP_A2A=1 \
      -e VLLM_B12X_MLA_CKV_GATHER=0 \
      -e OMP_NUM_THREADS=2 \
      -e NCCL_IB_DISABLE=1 \
      -e NCCL_P2P_LEVEL=4 \
      -e NCCL_PROTO=LL,LL128,Simple \
      -p "$HOST:$PORT:$PORT" \
      --entrypoint vllm \
      verdictai/glm53-flash-exl3-k4@sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca serve /model \
      --served-model-name GLM-5.3-Flash-EXL3-4bpw \
      --host 0.0.0.0 \
      --port "$PORT" \
      --language-model-only \
      --tensor-parallel-size 2 \
      --decode-context-parallel-size 2 \
      --dcp-comm-backend a2a \
      --dtype bfloat16 \
      --load-format safetensors \
      --moe-backend b12x \
      --attention-backend FLASHINFER_MLA_SPARSE_SM120 \
      --kv-cache-dtype fp8_ds_mla \
      --max-model-len 262144 \
      --max-num-batched-tokens 2048 \
      --max-num-seqs 1 \
      --gpu-memory-utilization 0.986 \
      --enable-chunked-prefill \
      --no-enable-prefix-caching \
      --generation-config /model \
      --reasoning-parser glm45 \
      --disable-custom-all-reduce \
      --speculative-config '{"method":"mtp","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}'
    ;;
  long500k)
    devices="${CUDA_VISIBLE_DEVICES:-0,1}"
    # the card's serve script: PROFILE=long500k (read on the host)
    cache=(); if [ -n "${SM120_CACHE_DIR:-}" ]; then cache=(-v "$SM120_CACHE_DIR":/root/.cache); fi
    exec docker run --rm \
      --gpus "\"device=$devices\"" \
      --init --ipc host \
      --shm-size 32g -v "$SM120_MODEL":/model:ro \
      "${cache[@]}" \
      -e VLLM_ENGINE_READY_TIMEOUT_S=3600 \
      -e VLLM_B12X_GLM_NOPE_NVFP4=1 \
      -e VLLM_USE_B12X_DCP_A2A=1 \
      -e VLLM_B12X_MLA_CKV_GATHER=0 \
      -e OMP_NUM_THREADS=2 \
      -e NCCL_IB_DISABLE=1 \
      -e NCCL_P2P_LEVEL=4 \
      -e NCCL_PROTO=LL,LL128,Simple \
      -p "$HOST:$PORT:$PORT" \
      --entrypoint vllm \
      verdictai/glm53-flash-exl3-k4@sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca serve /model \
      --served-model-name GLM-5.3-Flash-EXL3-4bpw \
      --host 0.0.0.0 \
      --port "$PORT" \
      --language-model-only \
      --tensor-parallel-size 2 \
      --decode-context-parallel-size 2 \
      --dcp-comm-backend a2a \
      --dtype bfloat16 \
      --load-format safetensors \
      --moe-backend b12x \
      --attention-backend B12X_MLA_SPARSE \
      --kv-cache-dtype nvfp4_ds_mla \
      --max-model-len 499968 \
      --max-num-batched-tokens 1024 \
      --max-num-seqs 1 \
      --gpu-memory-utilization 0.985 \
      --enable-chunked-prefill \
      --no-enable-prefix-caching \
      --generation-config /model \
      --reasoning-parser glm45 \
      --disable-custom-all-reduce \
      --speculative-config '{"method":"mtp","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}'
    ;;
  fidelity)
    devices="${CUDA_VISIBLE_DEVICES:-0,1}"
    # the card's serve script: CACHE=fp8_ds_mla (read on the host)
    # the card's serve script: DCP=1 (read on the host)
    # the card's serve script: MTP_TOKENS=0 (read on the host)
    cache=(); if [ -n "${SM120_CACHE_DIR:-}" ]; then cache=(-v "$SM120_CACHE_DIR":/root/.cache); fi
    exec docker run --rm \
      --gpus "\"device=$devices\"" \
      --init --ipc host \
      --shm-size 32g -v "$SM120_MODEL":/model:ro \
      "${cache[@]}" \
      -e VLLM_ENGINE_READY_TIMEOUT_S=3600 \
      -e VLLM_B12X_GLM_NOPE_NVFP4=1 \
      -e VLLM_USE_B12X_DCP_A2A=1 \
      -e VLLM_B12X_MLA_CKV_GATHER=0 \
      -e OMP_NUM_THREADS=2 \
      -e NCCL_IB_DISABLE=1 \
      -e NCCL_P2P_LEVEL=4 \
      -e NCCL_PROTO=LL,LL128,Simple \
      -p "$HOST:$PORT:$PORT" \
      --entrypoint vllm \
      verdictai/glm53-flash-exl3-k4@sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca serve /model \
      --served-model-name GLM-5.3-Flash-EXL3-4bpw \
      --host 0.0.0.0 \
      --port "$PORT" \
      --language-model-only \
      --tensor-parallel-size 2 \
      --decode-context-parallel-size 1 \
      --dcp-comm-backend a2a \
      --dtype bfloat16 \
      --load-format safetensors \
      --moe-backend b12x \
      --attention-backend FLASHINFER_MLA_SPARSE_SM120 \
      --kv-cache-dtype fp8_ds_mla \
      --max-model-len 262144 \
      --max-num-batched-tokens 2048 \
      --max-num-seqs 1 \
      --gpu-memory-utilization 0.986 \
      --enable-chunked-prefill \
      --no-enable-prefix-caching \
      --generation-config /model \
      --reasoning-parser glm45 \
      --disable-custom-all-reduce \
      --enforce-eager
    ;;
  fidelity-nvfp4)
    devices="${CUDA_VISIBLE_DEVICES:-0,1}"
    # the card's serve script: DCP=1 (read on the host)
    # the card's serve script: MTP_TOKENS=0 (read on the host)
    cache=(); if [ -n "${SM120_CACHE_DIR:-}" ]; then cache=(-v "$SM120_CACHE_DIR":/root/.cache); fi
    exec docker run --rm \
      --gpus "\"device=$devices\"" \
      --init --ipc host \
      --shm-size 32g -v "$SM120_MODEL":/model:ro \
      "${cache[@]}" \
      -e VLLM_ENGINE_READY_TIMEOUT_S=3600 \
      -e VLLM_B12X_GLM_NOPE_NVFP4=1 \
      -e VLLM_USE_B12X_DCP_A2A=1 \
      -e VLLM_B12X_MLA_CKV_GATHER=0 \
      -e OMP_NUM_THREADS=2 \
      -e NCCL_IB_DISABLE=1 \
      -e NCCL_P2P_LEVEL=4 \
      -e NCCL_PROTO=LL,LL128,Simple \
      -p "$HOST:$PORT:$PORT" \
      --entrypoint vllm \
      verdictai/glm53-flash-exl3-k4@sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca serve /model \
      --served-model-name GLM-5.3-Flash-EXL3-4bpw \
      --host 0.0.0.0 \
      --port "$PORT" \
      --language-model-only \
      --tensor-parallel-size 2 \
      --decode-context-parallel-size 1 \
      --dcp-comm-backend a2a \
      --dtype bfloat16 \
      --load-format safetensors \
      --moe-backend b12x \
      --attention-backend B12X_MLA_SPARSE \
      --kv-cache-dtype nvfp4_ds_mla \
      --max-model-len 499968 \
      --max-num-batched-tokens 2048 \
      --max-num-seqs 1 \
      --gpu-memory-utilization 0.986 \
      --enable-chunked-prefill \
      --no-enable-prefix-caching \
      --generation-config /model \
      --reasoning-parser glm45 \
      --disable-custom-all-reduce \
      --enforce-eager
    ;;
  *)
    echo "unknown profile '$profile' (known: daily accuracy long500k fidelity fidelity-nvfp4)" >&2
    exit 2
    ;;
esac
