"""Rule-based verifiers: math, code (sandboxed), logic (reasoning-gym), QA, format, process, controls."""
