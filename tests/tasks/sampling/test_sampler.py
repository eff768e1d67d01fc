"""The sampler composes a round of any `sample` and `score` callables: it draws, hands the problems to `sample`
with the round's seed, the rows with their problems to `score`, and fills the batch from the verdicts."""

import polars as pl

from storage.seeds import derive_seed
from tasks.curation.config import MixConfig
from tasks.sampling.rounds import DynamicSamplingConfig, fill_batch
from tasks.sampling.sampler import GroupSampler

GROUP_SIZE = 4


def bank(n: int, reserved: int = 0) -> pl.DataFrame:
    ids = [f"p{i:02d}" for i in range(n)] + [f"v{i:02d}" for i in range(reserved)]
    return pl.DataFrame(
        {
            "problem_id": ids,
            "domain": ["math"] * len(ids),
            "prompt": [f"what is {i}?" for i in range(len(ids))],
            "answer": ["1"] * len(ids),
            "tests": [None] * len(ids),
            "entry_point": [None] * len(ids),
            "verifier": ["math"] * len(ids),
            "steps": [None] * len(ids),
            "metadata": [None] * len(ids),
            "params": [None] * len(ids),
            "level": [1] * len(ids),
            "source": ["drill"] * n + ["self-verify"] * reserved,
        },
        schema_overrides={name: pl.String for name in ("tests", "entry_point", "steps", "metadata", "params")},
    )


class Recorder:
    """A `sample` and a `score` that record their calls. Problems whose number is even are solved half the
    time (kept groups); odd ones never (dropped as all wrong)."""

    def __init__(self):
        self.sampled: list[tuple[list[str], int, int]] = []
        self.scored: list[int] = []

    def sample(self, problems: pl.DataFrame, round_: int, seed: int) -> pl.DataFrame:
        self.sampled.append((problems["problem_id"].to_list(), round_, seed))
        rows = [
            {
                "rollout_id": f"i00001-r{round_:02d}-g{k:06d}-s{s:02d}",
                "group_id": f"i00001-r{round_:02d}-g{k:06d}",
                "iteration": 1,
                "problem_id": problem_id,
                "response": "1" if int(problem_id[1:]) % 2 == 0 and s % 2 == 0 else "2",
                "n_tokens": 1,
                "self_certainty": None,
            }
            for k, problem_id in enumerate(problems["problem_id"])
            for s in range(GROUP_SIZE)
        ]
        return pl.DataFrame(rows, schema_overrides={"self_certainty": pl.Float64})

    def score(self, frame: pl.DataFrame) -> pl.DataFrame:
        self.scored.append(frame.height)
        correct = frame["response"] == frame["answer"]
        return pl.DataFrame(
            {
                "rollout_id": frame["rollout_id"],
                "verifier": ["math"] * frame.height,
                "verifier_version": ["test"] * frame.height,
                "reward": correct.cast(pl.Float64),
                "correct": correct,
            }
        )


def sampler(recorder: Recorder, problems: pl.DataFrame, **reserve) -> GroupSampler:
    config = DynamicSamplingConfig(groups_per_batch=3, oversample=1.0, max_rounds=4)
    return GroupSampler(
        recorder.sample, recorder.score, problems, config, MixConfig(), GROUP_SIZE, 5, 1, None, **reserve
    )


def test_rounds_compose_sample_and_score_until_the_batch_is_full():
    recorder = Recorder()
    groups = sampler(recorder, bank(12))
    filled = fill_batch(groups.draw, groups.config)
    assert filled.short_by == 0 and filled.groups.filter("kept").height == 3
    drawn = [problem for problems, _, _ in recorder.sampled for problem in problems]
    assert len(drawn) == len(set(drawn)) == filled.groups.height  # no problem drawn twice in an iteration
    assert [round_ for _, round_, _ in recorder.sampled] == list(range(1, filled.rounds + 1))
    assert [seed for _, _, seed in recorder.sampled] == [
        derive_seed(5, 1, round_, "sample") for round_ in range(1, filled.rounds + 1)
    ]
    assert recorder.scored == [GROUP_SIZE * len(problems) for problems, _, _ in recorder.sampled]
    rollouts = pl.concat(groups.rollouts)
    assert rollouts.height == GROUP_SIZE * filled.groups.height  # dropped groups' rollouts are kept too
    assert pl.concat(groups.rewards)["rollout_id"].to_list() == rollouts["rollout_id"].to_list()
    kept = filled.groups.filter("kept")["problem_id"].to_list()
    assert all(int(problem[1:]) % 2 == 0 for problem in kept)


def test_a_reserved_source_is_drawn_only_at_its_share():
    recorder = Recorder()
    without = sampler(recorder, bank(12, reserved=6), reserved_source="self-verify")
    without.draw(8, 1)
    assert not any(problem.startswith("v") for problem in recorder.sampled[-1][0])  # the mix never draws them
    shared = sampler(recorder, bank(12, reserved=6), reserved_source="self-verify", reserved_share=0.25)
    shared.draw(8, 1)
    assert sum(problem.startswith("v") for problem in recorder.sampled[-1][0]) == 2
