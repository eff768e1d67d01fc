"""RISE-style self-verification: tasks made of the lake's own rollouts, judged at answer and step level, mixed
into later rounds at the configured ratio, and reported per iteration beside the solve rate."""

import json

import polars as pl
import pytest

from tasks.proposals.judgements import first_wrong_step, judgement_reward, verification_answer
from tasks.rise import SelfVerifyConfig, verification_problems

STEPS = ["12*7=84", "84+61=145"]


@pytest.mark.parametrize(
    "response, step",
    [
        ("12*7 = 84\n84+61 = 145\n#### 145", None),  # every step reached
        ("12*7 = 83\n83+61 = 144\n#### 144", 1),  # a false first step
        ("12*7 = 84\n84+61 = 146\n#### 146", 2),  # a false second step
        ("#### 145", 1),  # no steps shown at all
    ],
)
def test_the_first_wrong_step_by_hand(response, step):
    assert first_wrong_step(response, STEPS) == step


@pytest.mark.parametrize(
    "response, truth, reward",
    [
        ("correct", (True, None), 1.0),
        ("wrong at step 2", (True, None), 0.0),
        ("wrong at step 1", (False, 1), 1.0),
        ("It is wrong at step 2.", (False, 1), 0.5),  # the verdict right, the step not
        ("wrong", (False, 1), 0.5),
        ("wrong", (False, None), 1.0),  # no step ground truth: the verdict is all there is
        ("correct", (False, 2), 0.0),
        ("I am not sure", (True, None), 0.0),
    ],
)
def test_judgement_rewards_by_hand(response, truth, reward):
    answer = json.dumps({"correct": truth[0], "wrong_step": truth[1]})
    assert judgement_reward(response, answer)[0] == reward


def test_tasks_are_balanced_between_right_and_wrong_rollouts_and_never_made_of_verifications():
    scored = pl.DataFrame(
        {
            "rollout_id": [f"r{i}" for i in range(10)],
            "problem_id": ["p"] * 10,
            "prompt": ["What is 12*7+61?"] * 10,
            "steps": [STEPS] * 10,
            "source": ["two_step"] * 8 + ["self-verify"] * 2,
            "response": [f"{word} 12*7 = 84\n84+61 = 145\n#### 145" for word in ("So", "Then", "Now")]
            + [f"12*7 = 8{i}\n#### 1" for i in range(5)]
            + ["correct", "correct"],
            "correct": [True] * 3 + [False] * 5 + [True, False],
        }
    )
    rows = verification_problems(scored, SelfVerifyConfig(tasks_per_iteration=4), iteration=1)
    assert {row["answer"] for row in rows} == {
        verification_answer(True, "", STEPS),
        verification_answer(False, "#### 1", STEPS),
    }
    answers = [json.loads(row["answer"]) for row in rows]
    assert sorted(a["correct"] for a in answers) == [False, False, True, True]
    assert all(a["wrong_step"] == 1 for a in answers if not a["correct"])
    assert all(row["source_uri"] in {f"rollout:r{i}" for i in range(8)} for row in rows)  # not r8, r9
    assert len({row["problem_id"] for row in rows}) == 4


def drill_loop(tmp_path, selfverify: dict, extra: dict) -> str:
    """Two loop iterations of a small tiny model on the drill, 8 groups of 4 a batch, with `selfverify`."""
    from helpers import SMALL_POLICY

    from flows.curation import curate_bank
    from flows.loop import rl_loop

    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "two_step", "count": 80, "seed": 0}]}, lake_uri)
    config = {
        "rollout": {
            "group_size": 4,
            "sampler": {"max_new_tokens": 16},
            "base_policy": SMALL_POLICY,
            "mix": {"level_weights": {1: 1.0}},
        },
        "dynamic_sampling": {"groups_per_batch": 8, "max_rounds": 1, "oversample": 1.0, "band": [-0.1, 1.1]},
        "verify": {"workers": 0},
        "train": {"micro_batch_size": 8},
        "selfverify": selfverify,
        **extra,
    }
    rl_loop(config, lake_uri=lake_uri)
    return lake_uri


def test_lagged_the_loop_makes_tasks_of_its_rollouts_and_draws_them_at_the_ratio(prefect_api, tmp_path):
    from storage.catalog import open_catalog
    from storage.lake import Lake

    lake_uri = drill_loop(
        tmp_path,
        {"enabled": True, "mode": "lagged", "tasks_per_iteration": 6, "ratio": 0.25},
        {
            "evaluation": {"max_problems": 10, "split": "train", "sampler": {"max_new_tokens": 8}},
            "loop": {"iterations": 2, "evaluate_every": 2},
        },
    )
    lake = Lake.open(lake_uri)
    tasks = lake.read("problems").filter(pl.col("source") == "self-verify")
    assert tasks.height == 12 and set(tasks["verifier"]) == {"self_verify"}  # 6 from each iteration
    made_from = {uri.split(":", 1)[1] for uri in tasks["source_uri"]}
    assert made_from <= set(lake.read("rollouts")["rollout_id"])
    drawn = lake.read("rollouts").join(lake.read("problems").select("problem_id", "source"), on="problem_id")
    per_iteration = drawn.group_by("iteration").agg(verifying=(pl.col("source") == "self-verify").sum() // 4)
    assert dict(per_iteration.iter_rows()) == {1: 0, 2: 2}  # 8 groups × 0.25, once tasks exist
    report = open_catalog(lake).sql("select * from self_verification order by iteration").pl()
    assert report["verification_rollouts"].to_list() == [0, 8]
    assert report["solve_rate"].is_not_null().all() and report["verification_accuracy"][1] is not None


def test_in_batch_the_same_policy_verifies_its_own_batch_and_both_train_in_one_update(prefect_api, tmp_path):
    """RISE as published: the verification prompts are built from this iteration's kept solutions, sampled by
    the same model version in the same iteration, scored against the verifier's verdicts, and trained in the
    same batch (outside `groups_per_batch`, so the solver's groups all stay)."""
    from storage.catalog import open_catalog
    from storage.lake import Lake
    from storage.schemas import VERIFICATION_ROUND

    lake_uri = drill_loop(
        tmp_path, {"enabled": True, "tasks_per_iteration": 6}, {"loop": {"iterations": 2, "evaluate_every": 0}}
    )
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts")
    tasks = lake.read("problems").filter(pl.col("source") == "self-verify")
    assert tasks.height == 12 and set(tasks["verifier"]) == {"self_verify"}  # 6 an iteration
    made_from = rollouts.join(
        tasks.select(rollout_id=pl.col("source_uri").str.split(":").list.get(1), task=pl.col("problem_id")),
        on="rollout_id",
    )
    answered = rollouts.filter(pl.col("round") == VERIFICATION_ROUND)
    assert answered["problem_id"].n_unique() == 12 and answered.height == 12 * 4
    for iteration in (1, 2):  # verified in the iteration that sampled them, by the same version
        solutions = made_from.filter(pl.col("iteration") == iteration)
        verifying = answered.filter(pl.col("problem_id").is_in(solutions["task"].implode()))
        assert verifying.height == 6 * 4 and set(verifying["iteration"]) == {iteration}
        assert set(verifying["model_version"]) == set(solutions["model_version"]) == {iteration - 1}
        assert (solutions["round"] == 1).all()  # from the solver's own batch
    rewards = lake.read("rewards").join(answered.select("rollout_id"), on="rollout_id", how="semi")
    assert rewards.height == answered.height and set(rewards["verifier"]) == {"self_verify"}
    batch = (
        lake.read("batches")
        .filter(pl.col("iteration") == 1)
        .join(rollouts.select("rollout_id", "round"), on="rollout_id")
    )
    assert batch.filter(pl.col("round") == 1)["group_id"].n_unique() == 8  # every solver group stays
    assert batch.filter(pl.col("round") == VERIFICATION_ROUND)["group_id"].n_unique() == 6  # and both train
    version_1 = lake.read("model_versions").filter(pl.col("model_version") == 1).row(0, named=True)
    assert version_1["iteration"] == 1  # one update for the whole batch
    metrics = lake.read("iteration_metrics").filter(pl.col("iteration") >= 1).sort("iteration")
    assert metrics["rounds"].to_list() == [1, 1] and metrics["groups"].to_list() == [8, 8]  # the mix's, not RISE's
    zone = open_catalog(lake).sql("select * from learning_zone_share order by iteration").pl()
    assert zone["groups"].to_list() == [8, 8]
    report = open_catalog(lake).sql("select * from self_verification order by iteration").pl()
    assert report["verification_rollouts"].to_list() == [24, 24]


@pytest.mark.parametrize(
    "section, message",
    [
        ({"selfverify": {"enabled": True, "ratio": 0.3}}, "selfverify.ratio applies to mode lagged"),
        ({"selfverify": {"enabled": True}, "selfplay": {"enabled": True}}, "a self-play iteration samples its own"),
    ],
)
def test_a_config_in_batch_cannot_honour_is_refused(section, message):
    from tasks.iteration import IterationConfig

    with pytest.raises(ValueError, match=message):
        IterationConfig.model_validate(section)
    lagged = {**section, "selfverify": {**section["selfverify"], "mode": "lagged"}}
    assert IterationConfig.model_validate(lagged).selfverify.mode == "lagged"
