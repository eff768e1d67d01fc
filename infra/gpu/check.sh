#!/usr/bin/env bash
# End-to-end check of the GPU path, for a GPU machine lent for a short time (one prepared run).
# What it exercises, in order, each step timed and its output kept under $OUT (default ./gpu-check):
#   1. torch sees the GPU; the hf backend samples on it with behaviour log-probs equal to a recomputation;
#   2. a training step on cuda with bf16 mixed precision through accelerate;
#   3. two iterations of the loop on the tiny model with rollout, training and evaluation on the GPU.
# vLLM is not installed here (it needs its own environment); infra/vllm/serve.sh covers that part.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-./gpu-check}
mkdir -p "$OUT"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
PY=${PY:-.venv/bin/python}

echo "== 1. device and sampling" | tee "$OUT/summary.txt"
timeout 300 "$PY" - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import torch
from tasks.rollout.hf import HFPolicy, sequence_logprobs
from tasks.rollout.sampling import SamplerConfig
from trainers.tiny import TinyModelConfig, build_model, tokenizer_corpus, train_tokenizer
assert torch.cuda.is_available(), "no GPU visible to torch"
print("device:", torch.cuda.get_device_name(0))
tokenizer = train_tokenizer(tokenizer_corpus(count=200))
model = build_model(TinyModelConfig(), tokenizer).to("cuda")
samples = [s for g in HFPolicy(model, tokenizer, 0, 256).generate(["What is 3*4+5?\n"] * 32, 8,
           SamplerConfig(max_new_tokens=32), seed=0, model_version=0) for s in g]
with torch.no_grad():
    again = sequence_logprobs(model, [s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
gap = max(float((torch.tensor(s.logprobs, device="cuda") - lp).abs().max()) for s, lp in zip(samples, again))
print(f"{len(samples)} samples on cuda; behaviour log-prob vs recomputation max gap {gap:.2e}")
assert gap < 1e-3
PY

echo "== 2-3. loop on the GPU" | tee -a "$OUT/summary.txt"
cat > "$OUT/gpu-demo.yaml" <<'YAML'
base: ../configs/demo.yaml
rollout: {device: cuda, batch_size: 256}
train: {device: cuda, mixed_precision: bf16}
loop: {iterations: 2, evaluate_every: 1}
YAML
sed -i "s#base: ../configs/demo.yaml#base: $(pwd)/configs/demo.yaml#" "$OUT/gpu-demo.yaml"
timeout 900 .venv/bin/rlvr run --config "$OUT/gpu-demo.yaml" --lake "$OUT/lake" 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
.venv/bin/rlvr sql "select iteration, model_version, trained_version, loss, eval_solve_rate from iteration_metrics order by 1" \
  --lake "$OUT/lake" | tee -a "$OUT/summary.txt"
