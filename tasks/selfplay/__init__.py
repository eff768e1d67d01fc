"""Toward an autonomous loop: code tasks the policy proposes, their validity rules and prompts, the sandboxed
executor, the self-play sampler of an iteration, SPICE's documents and challenges, RISE's verification tasks,
collapse metrics and the tripwire.

May import: storage, storage.config, tasks.curation, tasks.generators, tasks.rollout, tasks.sandbox,
tasks.tripwires, tasks.verification, tasks.verifiers.
"""
