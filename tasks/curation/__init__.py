"""The curation stage: source configs, readers and layouts, validation (reference solutions run in the sandbox),
exact and near dedup, decontamination, seeded training mixes, and the steps over the lake (`stage.py`).

May import: storage, storage.config, tasks.generators, storage.progress, tasks.sandbox, tasks.proposals (code-task rules),
tasks.verifiers, tasks.workspaces.
"""
