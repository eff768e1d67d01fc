"""Rule-based verifiers: math, code (sandboxed), logic (reasoning-gym), QA, format, process, controls; the worker pool
that scores with per-item deadlines (`engine.py`); every verifier registered by name in `registry.py`.

May import: tasks.curation, tasks.errors, tasks.generators, tasks.sandbox, tasks.selfplay, tasks.workspaces; no
storage: a verifier is pure.
"""
