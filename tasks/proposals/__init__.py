"""Tasks made from the policy's own outputs, as a domain library: self-play's code tasks (Absolute Zero: programs,
inputs, outputs, their validity rules and prompts), SPICE's documents and challenges, RISE's judgement tasks as
text (`judgements.py`), the sandboxed executor that runs and checks them, and their verifiers (`verifiers.py`).
No stage: the self-play stage (`tasks/selfplay/`) and RISE (`tasks/rise.py`) use them.

May import: storage, tasks.errors, tasks.sandbox, tasks.verifiers.
"""
