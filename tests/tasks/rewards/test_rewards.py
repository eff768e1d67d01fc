"""Reward composition: the formula by hand, the config's checks, and the composed reward reaching the
advantages end to end (an iteration, then a re-composition by `compute-advantages` without re-scoring)."""

import json
import warnings
from datetime import UTC

import polars as pl
import pytest
from helpers import CONFIG, curated

from tasks.rewards.compose import RewardConfig, compose

ROWS = pl.DataFrame(
    {
        "rollout_id": ["a", "b", "c", "d"],
        "domain": ["math", "math", "code", "qa"],
        "reward": [1.0, 0.0, 0.5, 1.0],
        "correct": [True, False, None, True],
        "format_reward": [1.0, 0.0, 1.0, 1.0],
        "process_reward": [None, 0.5, 1.0, None],
        "corrected_reward": [None, -0.2, None, 1.25],
        "self_certainty": [0.2, None, 0.1, 0.4],
        "n_tokens": [100, 2000, 500, 1500],
        "verifier:judge": [0.9, 0.1, None, 0.7],
    },
    schema_overrides={"corrected_reward": pl.Float64, "process_reward": pl.Float64},
)


def test_the_default_composition_is_the_verifier_reward():
    assert compose(ROWS, RewardConfig())["composed_reward"].to_list() == [1.0, 0.0, 0.5, 1.0]


def test_weights_mappings_and_length_by_hand():
    config = RewardConfig(
        components={
            "verifier": {
                "weight": 1.0,
                "mapping": {"math": {"correct": 1, "wrong": -1}},
            },  # math ±1, others as they are
            "format": {"weight": 0.1},
            "length": {"weight": -0.5},
            "verifier:judge": {"weight": 0.5},
        },
        free_tokens=1000,
        scale_tokens=1000,
    )
    composed = compose(ROWS, config)
    # a: +1 + 0.1 − 0 + 0.45;  b: −1 + 0 − 0.5 + 0.05;  c: 0.5 + 0.1 − 0 + 0 (no judge score);  d: 1 + 0.1 − 0.25 + 0.35
    assert composed["composed_reward"].round(6).to_list() == [1.55, -1.45, 0.6, 1.2]
    components = [json.loads(text) for text in composed["reward_components"]]
    assert components[1] == {"verifier": -1.0, "format": 0.0, "length": 1.0, "verifier:judge": 0.1}
    assert components[2]["verifier:judge"] is None  # absent: recorded as null, counted 0


def test_the_corrected_component_falls_back_to_the_raw_reward_without_an_audit():
    composed = compose(ROWS, RewardConfig(components={"corrected": {"weight": 1.0}}))
    assert composed["composed_reward"].to_list() == [1.0, -0.2, 0.5, 1.25]


def test_a_default_mapping_and_a_domain_mapping():
    config = RewardConfig(
        components={
            "verifier": {"mapping": {"default": {"correct": 2, "wrong": 0}, "code": {"correct": 1, "wrong": -1}}}
        }
    )
    assert compose(ROWS, config)["composed_reward"].to_list() == [2.0, 0.0, 0.0, 2.0]  # code 0.5 → 0


def test_the_self_certainty_kind_is_that_component_alone_in_place_of_the_verifier():
    intuitor = RewardConfig(kind="self_certainty")
    with pytest.raises(ValueError, match="1 of 4 rollouts have no self-certainty"):  # not a silent 0
        compose(ROWS, intuitor)
    assert compose(ROWS.drop_nulls("self_certainty"), intuitor)["composed_reward"].to_list() == [0.2, 0.1, 0.4]
    fallback = RewardConfig(kind="self_certainty", self_certainty_missing="zero")  # the fallback, named
    assert compose(ROWS, fallback)["composed_reward"].to_list() == [0.2, 0.0, 0.1, 0.4]
    assert RewardConfig.model_validate(intuitor.model_dump()) == intuitor  # a stored config reloads
    assert RewardConfig(kind="verifiable").is_default() and not intuitor.is_default()
    with pytest.raises(ValueError, match="reward.kind self_certainty is the self_certainty component alone"):
        RewardConfig(kind="self_certainty", components={"verifier": {"weight": 1}})


def test_bad_configs_are_refused_and_the_danger_zone_warned_once():
    with pytest.raises(ValueError, match="unknown reward component 'bleu'"):
        RewardConfig(components={"bleu": {"weight": 1}})
    with pytest.warns(UserWarning, match="worse than outcome-only"):
        RewardConfig(components={"verifier": {"weight": 0.95}, "process": {"weight": 0.05}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RewardConfig(components={"verifier": {"weight": 0.5}, "process": {"weight": 0.5}})  # no warning
    with pytest.raises(ValueError, match="lack"):
        compose(ROWS.drop("verifier:judge"), RewardConfig(components={"verifier:judge": {"weight": 1}}))


@pytest.fixture
def flows(prefect_api):
    from flows.iteration import compute_advantages, rl_iteration

    return rl_iteration, compute_advantages


def test_the_composed_reward_reaches_the_advantages_end_to_end(flows, lake, lake_uri):
    rl_iteration, compute_advantages = flows
    curated(lake_uri)
    reward = {
        "components": {"verifier": {"mapping": {"math": {"correct": 1, "wrong": -1}}}, "length": {"weight": -0.01}},
        "scale_tokens": 1,
    }
    rl_iteration({**CONFIG, "reward": reward}, lake_uri=lake_uri)
    rewards = lake.read("rewards")
    rollouts = lake.read("rollouts").select("rollout_id", "n_tokens")
    joined = rewards.join(rollouts, on="rollout_id")
    expected = (2 * pl.col("reward") - 1) - 0.01 * pl.col("n_tokens")  # the mix is all math
    assert joined.select((pl.col("composed_reward") - expected).abs().max()).item() < 1e-9
    advantages = lake.read("advantages").join(rewards.select("rollout_id", "composed_reward"), on="rollout_id")
    assert advantages.select((pl.col("reward") - pl.col("composed_reward")).abs().max()).item() < 1e-9
    groups = advantages.group_by("group_id").agg(pl.col("advantage").sum().abs())
    assert groups["advantage"].max() < 1e-6  # GRPO: zero-mean per group
    # a new reward config re-composes the stored signals, without scoring again
    scored_before = lake.read("runs").filter(pl.col("stage") == "verify").height
    compute_advantages(1, {**CONFIG, "reward": {"components": {"verifier": {"weight": 3.0}}}}, lake_uri)
    again = lake.read("advantages").join(rewards.select("rollout_id", "reward"), on="rollout_id", suffix="_stored")
    assert again.select((pl.col("reward") - 3 * pl.col("reward_stored")).abs().max()).item() < 1e-9
    assert lake.read("runs").filter(pl.col("stage") == "verify").height == scored_before


def test_the_self_reward_tripwire_names_each_signal_that_fell_below_its_bound():
    from tasks.rewards.collapse import SelfRewardTripwire, collapsed, self_reward_health

    rollouts = pl.DataFrame(
        {
            "iteration": [1, 1, 1, 1, 3, 3, 3, 3],
            "n_tokens": [40, 60, 50, 50, 10, 10, 10, 10],
            "response": ["x\n#### 1", "y\n#### 2", "#### 3", "z\n\n#### 4", *["#### 7\n"] * 4],
        }
    )
    metrics = pl.DataFrame({"iteration": [0, 1, 3], "entropy": [None, 0.9, 0.01]})
    health = self_reward_health(rollouts, metrics)
    assert health.rows() == [(1, 50.0, 1.0, 0.9), (3, 10.0, 0.25, 0.01)]  # tokens, diversity, entropy
    assert collapsed(health, 3, SelfRewardTripwire(min_answer_diversity=0.5)) == [
        "training entropy 0.010 nats below reward.tripwire.min_entropy 0.05",
        "mean response length 20% of iteration 1's below reward.tripwire.min_length_ratio 0.25",
        "answer diversity 25.0% below reward.tripwire.min_answer_diversity 0.5",
    ]
    off = SelfRewardTripwire(min_entropy=None, min_length_ratio=None, min_answer_diversity=None)
    assert collapsed(health, 3, off) == [] and collapsed(health, 1, SelfRewardTripwire()) == []  # before `after`
    assert RewardConfig(kind="self_certainty").has_external_verifier() is False
    assert (
        RewardConfig().has_external_verifier()
        and RewardConfig(components={"verifier:judge": {}}).has_external_verifier()
    )


def test_a_self_rewarded_loop_stops_when_its_tripwire_fires(prefect_api, tmp_path):
    """INTUITOR's reward has no verifier: the tripwire runs without self-play, after the iteration is recorded."""
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop
    from storage.lake import Lake
    from tasks.selfplay.health import CollapseDetected

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    run = {
        **RUN,
        "reward": {"kind": "self_certainty", "tripwire": {"after": 1, "min_entropy": 100.0}},
        "dynamic_sampling": {"groups_per_batch": 3, "band": [-0.1, 1.1], "max_rounds": 1},
    }  # as configs/intuitor.yaml
    with pytest.raises(
        CollapseDetected,
        match=r"self-rewarded run stopped after iteration 1: training entropy "
        r"[0-9.]+ nats below reward.tripwire.min_entropy 100",
    ):
        rl_loop(run, lake_uri=lake_uri)
    assert Lake.open(lake_uri).read("iteration_metrics")["iteration"].to_list() == [1]


def test_the_self_reward_tripwire_reads_the_first_iterations_rollouts_once_a_run(tmp_path, monkeypatch):
    """Each iteration is compared with the run's first: that iteration's rollouts are read once a run (kept in
    the run's baselines), and every later check reads only its own. Iteration 1's responses average 50 tokens,
    iterations 2 and 3 40 (80 %), iteration 4 10 (20 %, below the 25 % bound)."""
    from datetime import datetime

    from flows.loop_steps import check_self_reward
    from flows.run_config import RunConfig
    from storage.lake import Lake
    from tasks.selfplay.health import CollapseDetected

    lake = Lake.open(str(tmp_path / "lake"))
    tokens = {1: [40, 60, 50, 50], 2: [40] * 4, 3: [40] * 4, 4: [10] * 4}
    for iteration, counts in tokens.items():
        with lake.run("test", "write", {}, iteration=iteration) as run:
            lake.replace(
                "rollouts",
                pl.DataFrame(
                    {
                        "rollout_id": [f"r{iteration}-{i}" for i in range(4)],
                        "iteration": [iteration] * 4,
                        "problem_id": [f"p{i}" for i in range(4)],
                        "group_id": [f"g{i}" for i in range(4)],
                        "sample_idx": [0] * 4,
                        "model_version": [iteration - 1] * 4,
                        "n_tokens": counts,
                        "response": [f"step {iteration}\n#### {i}" for i in range(4)],
                    }
                ),
                {"iteration": iteration},
                run,
            )
            lake.replace(
                "iteration_metrics",
                pl.DataFrame(
                    {
                        "iteration": [iteration],
                        "model_version": [iteration - 1],
                        "entropy": [0.9],
                        "created_at": [datetime.now(UTC)],
                    }
                ),
                {"iteration": iteration},
                run,
            )
    read_rows, original = [], Lake.read

    def counted(self, name, *args, **kwargs):
        rows = original(self, name, *args, **kwargs)
        if name == "rollouts":
            read_rows.extend(rows["iteration"].to_list())
        return rows

    monkeypatch.setattr(Lake, "read", counted)
    settings = RunConfig.model_validate({"reward": {"kind": "self_certainty", "tripwire": {"after": 2}}})
    baselines = {}
    check_self_reward(lake, settings, 2, baselines)
    check_self_reward(lake, settings, 3, baselines)
    with pytest.raises(
        CollapseDetected,
        match=r"after iteration 4: mean response length 20% of iteration 1's "
        r"below reward.tripwire.min_length_ratio 0.25",
    ):
        check_self_reward(lake, settings, 4, baselines)
    assert read_rows.count(1) == 4  # iteration 1's four rollouts, once for the three checks
    assert sorted(read_rows) == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
