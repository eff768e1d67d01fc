"""Rule-based verifiers: math, code (sandboxed), logic (reasoning-gym), QA, format, process, controls, and the
registry's base (`base.py`). A domain library: it imports no stage and no other task maker; the verifiers of
self-play's tasks and of workspaces sit with them (`tasks/proposals/`, `tasks/workspaces/`), and the registry of
them all with the verification stage (`tasks/verification/`).

May import: tasks.errors, tasks.sandbox, policy (the judge's server addresses), storage (seeds derived from
names, for the random controls); nothing of the lake: a verifier is pure.
"""
