"""The verification stage: scoring rollouts with the registered verifiers (`stage.py`), the worker pool that runs
them with per-item deadlines (`engine.py`), every verifier registered by name (`registry.py`), and `rlvr verify`'s
input files (`files.py`). The verifiers themselves are domain libraries below it (`tasks/verifiers/`,
`tasks/proposals/`, `tasks/workspaces/`).

May import: storage, policy, tasks.errors, tasks.proposals, tasks.rewards, tasks.sandbox, tasks.verifiers,
tasks.workspaces.
"""
