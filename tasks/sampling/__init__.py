"""Dynamic sampling: the group statistics and keep rule (`groups.py`), the round loop that draws until the batch
is full (`rounds.py`), sampling guided by the lake's history (`guided.py`), and the sampler that composes a round
of the rollout stage's `sample` and the verification stage's `score` (`sampler.py`). It samples nothing itself:
the stages hand it their callables.

May import: storage, tasks.curation (the training mix), tasks.verification (problem fields, a rollout's own verdict).
"""
