#!/usr/bin/env bash
# Start one vLLM OpenAI-compatible server per GPU for the `openai` rollout backend.
#   MODEL      base checkpoint folder (served as v0)               [required]
#   GPUS       GPU indices, one server each                        [default: 0]
#   BASE_PORT  port of the first server; the next ones count up    [default: 8000]
#   VLLM_ENV   virtual environment holding vLLM                    [default: ~/vllm-env]
#   MAX_LORAS  LoRA adapters (model versions) resident at once     [default: 4]
set -euo pipefail
: "${MODEL:?set MODEL to the base checkpoint folder}"
GPUS=${GPUS:-0}
BASE_PORT=${BASE_PORT:-8000}
VLLM_ENV=${VLLM_ENV:-$HOME/vllm-env}
MAX_LORAS=${MAX_LORAS:-4}
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True   # new model versions load as adapters without a restart
# --logprobs-mode processed_logprobs: log-probs of the distribution actually sampled (after temperature,
# top-k, top-p), which is what the trainer's ratio needs; vLLM's default is the raw logits' log-softmax.

port=$BASE_PORT
for gpu in $GPUS; do
  CUDA_VISIBLE_DEVICES=$gpu "$VLLM_ENV/bin/vllm" serve "$MODEL" \
    --served-model-name v0 --host 0.0.0.0 --port "$port" \
    --enable-lora --max-loras "$MAX_LORAS" --max-lora-rank 64 \
    --max-logprobs 1 --logprobs-mode processed_logprobs --seed 0 >"vllm-gpu$gpu.log" 2>&1 &
  echo "GPU $gpu: http://$(hostname):$port (log: vllm-gpu$gpu.log)"
  port=$((port + 1))
done
wait
