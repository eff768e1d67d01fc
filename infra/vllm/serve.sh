#!/usr/bin/env bash
# Start one vLLM OpenAI-compatible server per GPU for the `openai` rollout backend.
#   MODEL      base checkpoint folder (model version 0)                          [required]
#   GPUS       GPU indices, one server each                                      [default: 0]
#   BASE_PORT  port of the first server; the next ones count up                  [default: 8000]
#   VLLM_ENV   virtual environment holding vLLM                                  [default: ~/vllm-env]
#   WEIGHTS    adapter: versions are LoRA adapters loaded by name (v0, v1, ...);
#              full: one model served as SERVED_NAME, full weights swapped in place
#              through the worker extension rlvr_weights.CheckpointLoader        [default: adapter]
#   SERVED_NAME  the one name with WEIGHTS=full (rollout.openai.model_name)      [default: policy]
#   MAX_LORAS  LoRA adapters (model versions) resident at once                   [default: 4]
#   GPU_MEMORY_UTILIZATION  vLLM's share of its GPU's memory; below 0.9 when a
#              trainer shares the GPU (rollout.openai.gpu_memory_utilization)    [default: 0.9]
#   SLEEP      1: --enable-sleep-mode, so the loop puts the servers to sleep during each
#              training step (rollout.openai.sleep_while_training)               [default: 0]
# Layouts: configs/gpu.yaml (one GPU shared: GPU_MEMORY_UTILIZATION=0.45) and configs/gpu-8.yaml
# (eight GPUs: GPUS="0 1 2 3", the trainer on 4).
set -euo pipefail
: "${MODEL:?set MODEL to the base checkpoint folder}"
GPUS=${GPUS:-0}
BASE_PORT=${BASE_PORT:-8000}
VLLM_ENV=${VLLM_ENV:-$HOME/vllm-env}
WEIGHTS=${WEIGHTS:-adapter}
SERVED_NAME=${SERVED_NAME:-policy}
MAX_LORAS=${MAX_LORAS:-4}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.9}
SLEEP=${SLEEP:-0}
here=$(cd "$(dirname "$0")" && pwd)

# Every server:
# --generation-config vllm: no sampling defaults from the model's generation_config.json (Qwen2.5-Instruct's
#   repetition_penalty 1.1 would bias every behaviour log-prob; the backend states every parameter anyway).
# --logprobs-mode processed_logprobs: log-probs of the distribution actually sampled (after temperature,
#   top-k, top-p), which is what the trainer's ratio needs; vLLM's default is the raw logits' log-softmax.
common=(--host 0.0.0.0 --generation-config vllm --max-logprobs 1 --logprobs-mode processed_logprobs --seed 0
        --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION")
case $WEIGHTS in
  adapter)
    export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True   # new versions load as adapters without a restart
    mode=(--served-model-name v0 --enable-lora --max-loras "$MAX_LORAS" --max-lora-rank 64) ;;
  full)
    export VLLM_SERVER_DEV_MODE=1                  # /collective_rpc, /reset_prefix_cache, /pause, /resume
    export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" RLVR_BASE_VERSION=0
    mode=(--served-model-name "$SERVED_NAME" --worker-extension-cls rlvr_weights.CheckpointLoader) ;;
  *) echo "WEIGHTS must be adapter or full, not $WEIGHTS" >&2; exit 2 ;;
esac
if [ "$SLEEP" = 1 ]; then
  export VLLM_SERVER_DEV_MODE=1                    # /sleep and /wake_up
  mode+=(--enable-sleep-mode)
fi

port=$BASE_PORT
for gpu in $GPUS; do
  CUDA_VISIBLE_DEVICES=$gpu "$VLLM_ENV/bin/vllm" serve "$MODEL" --port "$port" "${common[@]}" "${mode[@]}" \
    >"vllm-gpu$gpu.log" 2>&1 &
  echo "GPU $gpu: http://$(hostname):$port ($WEIGHTS weights, ${GPU_MEMORY_UTILIZATION} of the GPU's memory; log: vllm-gpu$gpu.log)"
  port=$((port + 1))
done
wait
