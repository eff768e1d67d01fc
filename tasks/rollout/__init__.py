"""On-policy rollout: the stage that samples groups from the bank into the `rollouts` table (the samplers
themselves are `policy`'s), the base policy (version 0), the rows it writes and multi-turn tool episodes.

May import: policy, storage, tasks.advantages (dynamic sampling), tasks.curation, tasks.curriculum,
tasks.generators, tasks.rewards, tasks.rise (lagged verification tasks drawn), tasks.sandbox (tool episodes), tasks.verification.
"""
