#!/usr/bin/env bash
# The GPU check, for a bare GPU host lent for a short time (one prepared run, well under 8 minutes):
# it needs only torch and transformers (accelerate and peft if present) and this checkout; no Prefect,
# Polars, Delta, DuckDB, pydantic or rich. What it measures (infra/gpu/check.py has the details):
#   1. sampling on the GPU: transformers' generate with scores, and the project's hf sampler when it
#      imports (it needs pydantic), tokens/s of each on the same model and batch, each warmed up first;
#   2. the gap between the sampled tokens' behaviour log-probs and the trainer's recomputation;
#   3. training steps with the trainer's loss in bf16, tokens/s (after one untimed step); on 2+ GPUs, the
#      same batch over two data-parallel processes (NCCL) and the gap between their summed gradient and
#      one process's (on one GPU its line says it was skipped).
#   4. with VLLM_ENV (a virtual environment holding vLLM): serve.sh WEIGHTS=full on the model, its sampled
#      log-probs against the trainer's and a full-weight swap (infra/gpu/vllm_part.py); skipped without it.
# Each part is isolated: one that raises gets an error line and the next part runs.
# The shapes in $SHAPES run (default: the tiny model and Qwen2-0.5B's; random weights, nothing is
# downloaded), each under a limit of $TIMEOUT_S seconds (default 240); one that fails or runs out of
# time does not stop the next.
# Output: stdout is JSON lines only, one per part and one per shape ({"part": "run", "shape": ...,
# "exit_code": N, "timed_out": ...}), also kept in $OUT/summary.jsonl (default ./gpu-check); stderr
# (warnings, logging, tracebacks) goes to $OUT/stderr.log. Exit status 1 when a shape did not exit 0.
# Arguments are passed to check.py (e.g. --batch 32 --new-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-./gpu-check}
mkdir -p "$OUT"
PY=${PY:-python3}
SHAPES=${SHAPES:-tiny 0.5b}
TIMEOUT_S=${TIMEOUT_S:-240}
failed=0
for shape in $SHAPES; do
  echo "=== shape $shape, $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$OUT/stderr.log"
  started=$SECONDS
  status=0
  timeout -k 10 "$TIMEOUT_S" "$PY" infra/gpu/check.py --shape "$shape" "$@" 2>>"$OUT/stderr.log" \
    | tee -a "$OUT/summary.jsonl" || status=${PIPESTATUS[0]}
  seconds=$((SECONDS - started))
  timed_out=false
  if [ "$status" -eq 124 ] || { [ "$status" -eq 137 ] && [ "$seconds" -ge "$TIMEOUT_S" ]; }; then
    timed_out=true
  fi
  ok=$([ "$status" -eq 0 ] && echo true || echo false)
  [ "$status" -eq 0 ] || failed=1
  printf '{"part": "run", "shape": "%s", "exit_code": %d, "timed_out": %s, "timeout_s": %s, "seconds": %d, "ok": %s}\n' \
    "$shape" "$status" "$timed_out" "$TIMEOUT_S" "$seconds" "$ok" | tee -a "$OUT/summary.jsonl"
done
echo "check.sh: JSON lines in $OUT/summary.jsonl, stderr in $OUT/stderr.log" >&2
exit "$failed"
