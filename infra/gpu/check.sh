#!/usr/bin/env bash
# The GPU check, for a bare GPU host lent for a short time (one prepared run, well under 8 minutes):
# it needs only torch and transformers (accelerate and peft if present) and this checkout; no Prefect,
# Polars, Delta, DuckDB, pydantic or rich. What it measures (infra/gpu/check.py has the details):
#   1. sampling on the GPU: transformers' generate with scores, and the project's hf sampler when it
#      imports (it needs pydantic), tokens/s of each on the same model and batch;
#   2. the gap between the sampled tokens' behaviour log-probs and the trainer's recomputation;
#   3. training steps with the trainer's loss in bf16, tokens/s; on 2+ GPUs, the same batch over two
#      data-parallel processes (NCCL) and the gap between their summed gradient and one process's.
# Both shapes run: the tiny model and Qwen2-0.5B's (random weights: nothing is downloaded).
# Output: one JSON line per part, kept in $OUT/summary.jsonl (default ./gpu-check).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-./gpu-check}
mkdir -p "$OUT"
PY=${PY:-python3}
for shape in tiny 0.5b; do
  timeout 240 "$PY" infra/gpu/check.py --shape "$shape" "$@" 2>&1 | tee -a "$OUT/summary.jsonl"
done
