"""An external run's `groups` under OpenRLHF's one-response requests: each commit recomputes only the groups it
added a response to (it reads no stored row after the step's first commit), and the table stays exactly what a
full recomputation of the iteration gives, also after a failed commit and across a restarted recorder."""

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from storage.lake import Lake
from tasks.interop.recording import Attempt, ExternalRun

PROBLEMS, SAMPLES = 8, 4
STATS = [
    "group_id",
    "problem_id",
    "model_version",
    "n_samples",
    "mean_reward",
    "std_reward",
    "min_reward",
    "max_reward",
    "solve_rate",
    "kept",
]


def verdict(reward: float) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "rollout_id": ["0"],
            "verifier": ["exact"],
            "verifier_version": ["1"],
            "reward": [reward],
            "correct": [reward == 1.0],
        }
    )


def reward_of(problem: int, sample: int) -> float:
    return 1.0 if sample < problem % (SAMPLES + 1) else 0.0  # problem p: its first p % 5 samples right


@pytest.fixture
def counted(tmp_path):
    """A recorder whose lake counts the rollouts and rewards rows each read returns."""
    lake = Lake.open(str(tmp_path / "lake"))
    total = [0]
    read = lake.read

    def counting(name, *args, **kwargs):
        rows = read(name, *args, **kwargs)
        if name in ("rollouts", "rewards"):
            total[0] += rows.height
        return rows

    lake.read = counting
    return lake, ExternalRun(lake, "orl", "openrlhf"), total


def rows_read(total: list[int], recorder: ExternalRun, attempt: Attempt, reward: float) -> int:
    before = total[0]
    recorder.record([attempt], verdict(reward))
    return total[0] - before


def stored_groups(lake: Lake) -> pl.DataFrame:
    return lake.read("groups").select(STATS).sort("group_id")


def full_recomputation(recorder: ExternalRun) -> pl.DataFrame:
    return recorder._groups(0).select(STATS)


def test_each_commit_reads_only_its_group_and_the_groups_equal_a_full_recomputation(counted):
    lake, recorder, total = counted
    reads = []
    # 32 one-response commits into step 0, sample-major as OpenRLHF's requests arrive: commit k adds sample k // 8
    for sample in range(SAMPLES):
        for problem in range(PROBLEMS):
            reads.append(
                rows_read(
                    total,
                    recorder,
                    Attempt(0, "m", f"p{problem}", f"r{sample}", f"ext-{problem}"),
                    reward_of(problem, sample),
                )
            )
        assert_frame_equal(stored_groups(lake), full_recomputation(recorder), check_dtypes=False)
    # the first commit reads the step's 1 rollout and 1 reward, the others none (their rows are in memory):
    # recomputing the step at every commit read 2 (k + 1) at commit k
    assert reads == [2] + [0] * (PROBLEMS * SAMPLES - 1)
    groups = stored_groups(lake)
    assert groups["n_samples"].to_list() == [SAMPLES] * PROBLEMS
    solve_rates = dict(zip(groups["problem_id"], groups["solve_rate"]))
    assert solve_rates == {f"ext-{p}": min(p % 5, SAMPLES) / SAMPLES for p in range(PROBLEMS)}


def test_a_failed_commit_leaves_the_groups_a_full_recomputation_of_the_visible_rows(counted):
    lake, recorder, _ = counted
    for problem in range(3):
        recorder.record([Attempt(0, "m", f"p{problem}", "r", f"ext-{problem}")], verdict(1.0))
    replace = lake.replace

    def refused(name, *args, **kwargs):
        if name == "groups":
            raise OSError("disk full")
        return replace(name, *args, **kwargs)

    lake.replace = refused
    with pytest.raises(OSError, match="disk full"):  # its rows stay hidden, its groups unwritten
        recorder.record([Attempt(0, "m", "p0", "lost", "ext-0")], verdict(0.0))
    lake.replace = replace
    recorder.record([Attempt(0, "m", "p1", "r2", "ext-1")], verdict(0.0))
    groups = stored_groups(lake)
    assert_frame_equal(groups, full_recomputation(recorder), check_dtypes=False)
    assert dict(zip(groups["problem_id"], groups["n_samples"])) == {"ext-0": 1, "ext-1": 2, "ext-2": 1}
    assert dict(zip(groups["problem_id"], groups["mean_reward"])) == {"ext-0": 1.0, "ext-1": 0.5, "ext-2": 1.0}


def test_a_restarted_recorder_and_an_iteration_written_again_after_others_keep_the_groups_whole(counted):
    lake, first, _ = counted
    for sample in range(2):
        first.record([Attempt(0, "m", "p0", f"r{sample}", "ext-0")], verdict(1.0))
    restarted = ExternalRun(lake, "orl", "openrlhf")  # a restarted server's recorder, on the same step
    restarted.record([Attempt(0, "m", "p0", "r2", "ext-0")], verdict(0.0))
    for step in range(1, 7):  # past the iterations a recorder keeps
        restarted.record([Attempt(step, "m", "p1", "r", "ext-1")], verdict(1.0))
    restarted.record(
        [Attempt(0, "m", "p0", "r3", "ext-0"), Attempt(6, "m", "p1", "r", "ext-1")],
        pl.DataFrame(
            {
                "rollout_id": ["0", "1"],
                "verifier": ["exact"] * 2,
                "verifier_version": ["1"] * 2,
                "reward": [0.0, 0.0],
                "correct": [False, False],
            }
        ),
    )
    stored = lake.read("groups").sort("iteration", "group_id")
    assert_frame_equal(
        stored.select(STATS), pl.concat([restarted._groups(i) for i in range(7)]).select(STATS), check_dtypes=False
    )
    assert stored.select("iteration", "n_samples", "mean_reward").rows() == [(0, 4, 0.5)] + [
        (i, 1, 1.0) for i in range(1, 6)
    ] + [(6, 2, 0.5)]
