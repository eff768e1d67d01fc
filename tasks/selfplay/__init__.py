"""Self-play as a stage: the sampler of a self-play iteration (propose, validate, solve, reward), collapse
metrics and the tripwire. The tasks it makes and checks are `tasks/proposals/`'s.

May import: storage, policy, tasks.curation, tasks.generators, tasks.proposals, tasks.rollout, tasks.sandbox,
tasks.tripwires, tasks.verification.
"""
