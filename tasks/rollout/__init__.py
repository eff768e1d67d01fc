"""On-policy rollout: policy backends (in-process transformers, OpenAI-compatible servers), prompt
templates, and the stage that samples groups from the bank into the `rollouts` table.

May import: storage, tasks.advantages (dynamic sampling), tasks.config, tasks.curation, tasks.curriculum,
tasks.generators, tasks.progress, tasks.rewards, tasks.sandbox (tool episodes), tasks.selfplay, tasks.verification.
"""
