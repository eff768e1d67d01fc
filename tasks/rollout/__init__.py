"""On-policy rollout: the stage that only samples, G responses per drawn problem into `rollouts` rows (the
samplers themselves are `policy`'s; drawing, scoring and refilling are `tasks/sampling/`'s), the base policy
(version 0), the rows it writes and multi-turn tool episodes.

May import: policy, storage, tasks.curation, tasks.curriculum, tasks.generators, tasks.rewards,
tasks.sampling (the `sample` side it provides), tasks.sandbox (tool episodes), tasks.verification.
"""
