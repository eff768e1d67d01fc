"""The verification stage over the lake: rewards per iteration, re-scoring, noise correction."""

import json

import polars as pl
import pytest
from helpers import seed_iteration


@pytest.fixture
def verify_iteration(prefect_api):
    from flows.verification import verify_iteration

    return verify_iteration


def test_rewards_for_an_iteration(verify_iteration, lake, lake_uri):
    rollouts = seed_iteration(lake)
    result = verify_iteration(1, {"workers": 2}, lake_uri)
    rewards = lake.read("rewards").sort("rollout_id")
    assert rewards.height == rollouts.height
    assert rewards.group_by("verifier").agg(pl.col("reward").sum()).sort("verifier").rows() == [
        ("code", 1.0),
        ("math", 4.0),
    ]
    assert dict(rewards.select("verifier", "verifier_version").unique().rows()) == {"math": "2.2", "code": "1.1"}
    assert set(rewards["run_id"]) == {result["run_id"]}
    assert json.loads(rewards.filter(pl.col("verifier") == "code")["details"][0])["tests_total"] == 1
    runs = lake.read("runs").filter(pl.col("stage") == "verify")
    assert runs.select("iteration", "status").rows() == [(1, "completed")]


def test_rescoring_replaces_its_own_rows_and_keeps_other_verifiers(verify_iteration, lake, lake_uri):
    seed_iteration(lake)
    verify_iteration(1, {"workers": 0}, lake_uri)
    verify_iteration(1, {"workers": 0}, lake_uri)
    verify_iteration(1, {"workers": 0, "verifier": "flipped"}, lake_uri)
    rewards = lake.read("rewards")
    counts = dict(rewards.group_by("verifier").len().rows())
    assert counts == {"math": 8, "code": 2, "flipped": 10}
    disagreement = rewards.pivot(on="verifier", index="rollout_id", values="reward", aggregate_function="first")
    math_rows = disagreement.drop_nulls("math")
    assert (math_rows["math"] + math_rows["flipped"]).to_list() == [1.0] * 8
    assert lake.read("runs").filter(pl.col("stage") == "verify").height == 3


def record_audit(lake, rho0: float, rho1: float, verifier: str = "math", version: str = "2.2") -> None:
    from tasks.verification.stage import noise_outputs
    from tasks.verifiers.noise import NoiseEstimate

    with lake.run("test", "audit", {}) as run:
        lake.commit(noise_outputs(verifier, version, NoiseEstimate(rho0, rho1, 50, 50), "test"), run)


def test_noise_correction_uses_the_latest_audit(verify_iteration, lake, lake_uri, tmp_path):
    seed_iteration(lake)
    record_audit(lake, 0.3, 0.3)
    record_audit(lake, 0.1, 0.2)  # the latest
    verify_iteration(1, {"workers": 0, "noise_correction": True}, lake_uri)
    rewards = lake.read("rewards")
    math = rewards.filter(pl.col("verifier") == "math")
    expected = ((math["reward"] - 0.1) / (1 - 0.1 - 0.2)).to_list()
    assert math["corrected_reward"].to_list() == pytest.approx(expected)
    assert rewards.filter(pl.col("verifier") == "code")["corrected_reward"].null_count() == 2


def test_missing_rollouts_are_a_clear_error(verify_iteration, lake, lake_uri):
    seed_iteration(lake)
    with pytest.raises(ValueError, match="iteration 9 has no rollouts"):
        verify_iteration(9, {}, lake_uri)


def test_audit_command_stores_rho(cli, tmp_path):
    lake = str(tmp_path / "lake")
    lines = [
        {"id": i, "domain": "math", "ground_truth": "2", "response": r"\boxed{2}", "label": True} for i in range(8)
    ]
    lines += [
        {"id": 100 + i, "domain": "math", "ground_truth": "2", "response": r"\boxed{3}", "label": False}
        for i in range(6)
    ]
    lines += [
        {"id": 200, "domain": "math", "ground_truth": "2", "response": r"\boxed{3}", "label": True},  # a false negative
        {"id": 201, "domain": "math", "ground_truth": "2", "response": r"\boxed{2}", "label": False},
    ]  # a false positive
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = cli("audit-verifier", str(path), "--workers", "2", "--lake", lake)
    assert result.returncode == 0, result.stderr
    stored = cli(
        "sql", "select verifier, rho0, rho1, n_correct, n_wrong from verifier_noise", "--format", "json", "--lake", lake
    )
    assert json.loads(stored.stdout) == {"verifier": "math", "rho0": 1 / 7, "rho1": 1 / 9, "n_correct": 9, "n_wrong": 7}
    bounds = json.loads(
        cli(
            "sql",
            "select rho0_low, rho0_high, rho1_low, rho1_high from verifier_noise",
            "--format",
            "json",
            "--lake",
            lake,
        ).stdout
    )
    from tasks.verifiers.noise import wilson_interval

    assert (bounds["rho0_low"], bounds["rho0_high"]) == pytest.approx(wilson_interval(1, 7))
    assert (bounds["rho1_low"], bounds["rho1_high"]) == pytest.approx(wilson_interval(1, 9))
    assert bounds["rho0_low"] < 1 / 7 < bounds["rho0_high"] and "[" in result.stdout


def test_audit_against_a_reference_verifier_keeps_lines_aligned(cli, tmp_path):
    """`process` (stricter: wants the steps too) as the truth for `math`, with 2 workers and many lines."""
    lake = str(tmp_path / "lake")
    lines = []
    for i in range(40):
        right_steps = i % 2 == 0
        steps = "3*4=12, 12+5=17" if right_steps else "3*4=13, 13+5=18"
        answer = 17 if i % 4 < 3 else 18
        lines.append(
            {
                "id": i,
                "domain": "math",
                "ground_truth": "17",
                "steps": ["3*4=12", "12+5=17"],
                "response": f"{steps}. \\boxed{{{answer}}}",
            }
        )
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = cli("audit-verifier", str(path), "--reference", "flipped", "--workers", "2", "--lake", lake)
    assert result.returncode == 0, result.stderr
    stored = json.loads(cli("sql", "select rho0, rho1 from verifier_noise", "--format", "json", "--lake", lake).stdout)
    # flipped keeps `correct` as the truth of math: aligned lines mean math agrees with it everywhere
    assert stored == {"rho0": 0.0, "rho1": 0.0}


def test_a_rollout_without_its_problem_is_reported_and_the_rest_scored(lake, capsys):
    from tasks.verification.stage import VerifyConfig, rollouts_with_problems, score_rollouts

    rollouts = seed_iteration(lake)
    orphan = rollouts.head(1).with_columns(rollout_id=pl.lit("orphan"), problem_id=pl.lit("gone"))
    with lake.run("test", "rollout", {}, iteration=1) as run:
        lake.replace("rollouts", pl.concat([rollouts, orphan]), {"iteration": 1}, run)
    rewards = score_rollouts(rollouts_with_problems(lake, 1), VerifyConfig(workers=0))
    assert rewards.height == rollouts.height + 1
    skipped = rewards.filter(pl.col("rollout_id") == "orphan").row(0, named=True)
    assert skipped["reward"] == 0.0 and skipped["correct"] is None
    assert json.loads(skipped["details"])["reason"] == "skipped: its problem is not in the bank"
    assert rewards.filter(pl.col("rollout_id") != "orphan")["reward"].sum() == 5.0  # the others, as before
    assert "1 of 11 rollouts could not be scored: 1 skipped: its problem is not in the bank" in capsys.readouterr().out


def test_noise_correction_reaches_training_through_the_loop(lake, lake_uri, prefect_api):
    """The loop's own scoring applies the latest audit, and the `corrected` component makes advantages use it."""
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration

    curated(lake_uri)
    config = {
        **CONFIG,
        "verify": {"workers": 0, "verifier": "random", "noise_correction": True},
        "reward": {"components": {"corrected": {"weight": 1.0}}},
    }
    record_audit(lake, 0.2, 0.1, verifier="random", version=_version("random"))
    rl_iteration(config, lake_uri=lake_uri)
    rewards = lake.read("rewards")
    expected = (rewards["reward"] - 0.2) / (1 - 0.2 - 0.1)
    assert (rewards["corrected_reward"] - expected).abs().max() < 1e-9
    advantages = lake.read("advantages").join(rewards.select("rollout_id", "corrected_reward"), on="rollout_id")
    assert (advantages["reward"] - advantages["corrected_reward"]).abs().max() < 1e-9


def test_wilson_intervals_by_hand():
    from tasks.verifiers.noise import estimate_noise, wilson_interval

    low, high = wilson_interval(5, 50)
    assert (round(low, 4), round(high, 4)) == (0.0435, 0.2136)  # the textbook value
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)
    import numpy as np

    noise = estimate_noise(np.array([True, False, True, True]), np.array([True, False, False, True]))
    assert noise.rho0 == 1.0 / 2 and (noise.rho0_low, noise.rho0_high) == wilson_interval(1, 2)


def _version(name: str) -> str:
    from tasks.verification.registry import build_verifier

    return build_verifier(name).version
