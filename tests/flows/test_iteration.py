"""One RL iteration end to end (rollout with resampling rounds → verification → advantages → batch)
on the tiny CPU policy, on local and S3 lakes, with lineage from every batch row back to the model
version, problem, bank version and runs; the round bound; the command line."""

import json
import math

import polars as pl
import pytest
from conftest import register_random_version
from helpers import CONFIG, SMALL_POLICY, curated

from storage.catalog import open_catalog
from tasks.sampling.rounds import BatchShortfall

TABLES = ("rollouts", "rewards", "groups", "advantages", "batches", "dbb_state", "model_versions")


@pytest.fixture
def rl_iteration(prefect_api):
    from flows.iteration import rl_iteration

    return rl_iteration


def test_one_iteration_writes_every_table_with_lineage(rl_iteration, lake, lake_uri):
    curated(lake_uri)
    result = rl_iteration(CONFIG, lake_uri=lake_uri)
    assert result["iteration"] == 1 and result["model_version"] == 0 and result["groups_kept"] == 3
    for table in TABLES:
        assert not lake.read(table).is_empty(), table
    rollouts = lake.read("rollouts")
    assert rollouts.group_by("group_id").len()["len"].to_list() == [4] * rollouts["group_id"].n_unique()
    row = rollouts.row(0, named=True)
    assert len(row["response_token_ids"]) == len(row["behaviour_logprobs"]) == row["n_tokens"]
    assert row["finish_reason"] in {"stop", "length"} and row["self_certainty"] > 0 and row["seed"] is not None
    expected = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "group_size": 4, "max_new_tokens": 16}
    assert json.loads(row["sampler"]).items() >= expected.items()
    assert row["prompt"].endswith("\nAnswer:")
    lineage = (
        open_catalog(lake)
        .sql("""
        select b.batch_id, r.model_version, m.checkpoint_uri, p.bank_version, rb.stage as batch_stage,
               rr.stage as rollout_stage, rw.stage as reward_stage, rp.stage as problem_stage
        from batches b join rollouts r using (rollout_id) join problems p using (problem_id)
        join rewards w using (rollout_id) join model_versions m using (model_version)
        join runs rb on rb.run_id = b.run_id join runs rr on rr.run_id = r.run_id
        join runs rw on rw.run_id = w.run_id join runs rp on rp.run_id = p.run_id
    """)
        .pl()
    )
    assert lineage.height == result["batch_rollouts"] == 12 and lineage.null_count().sum_horizontal()[0] == 0
    assert lineage.select("batch_stage", "rollout_stage", "reward_stage", "problem_stage").unique().rows() == [
        ("advantages", "rollout", "verify", "curate")
    ]


def test_the_verify_run_makes_the_rounds_verdicts_the_reward(rl_iteration, lake, lake_uri, monkeypatch):
    """Rollout hands over the verifiers' rows as the rounds scored them; the verification stage's own run makes
    them the reward training sees (noise correction, composition) and writes them."""
    import flows.iteration as module

    handed_over = []
    steps = module.reward_steps_task
    monkeypatch.setattr(module, "reward_steps_task", lambda *args: handed_over.append(args[1]) or steps(*args))
    curated(lake_uri)
    rl_iteration(CONFIG, lake_uri=lake_uri)
    [verdicts] = handed_over
    assert "composed_reward" not in verdicts.columns
    rewards = lake.read("rewards")
    assert rewards.height == verdicts.height and rewards["composed_reward"].null_count() == 0
    stages = lake.read("runs").filter(pl.col("run_id").is_in(rewards["run_id"].unique().implode()))["stage"]
    assert stages.to_list() == ["verify"]


def test_rerunning_an_iteration_replaces_its_output(rl_iteration, tmp_path):
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    first = rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    assert lake.read("rollouts")["rollout_id"].is_unique().all()
    assert lake.read("rewards").height == lake.read("rollouts").height == first["rollouts"]
    assert lake.read("batches")["batch_id"].n_unique() == 1 and lake.read("model_versions").height == 1
    assert rl_iteration(CONFIG, lake_uri=lake_uri)["iteration"] == 2


def test_rounds_until_the_bound_then_a_smaller_batch_or_a_clear_failure(rl_iteration, tmp_path):
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    never_solved = {**CONFIG, "verify": {"workers": 0}, "dynamic_sampling": {"groups_per_batch": 2, "max_rounds": 2}}
    smaller = rl_iteration(never_solved, iteration=1, lake_uri=lake_uri)  # the random policy solves nothing
    assert smaller["rounds"] == 2 and smaller["short_by"] == 2 and smaller["batch_rollouts"] == 0
    lake = Lake.open(lake_uri)
    groups = lake.read("groups")
    assert set(groups["round"]) == {1, 2} and set(groups["filter_reason"]) == {"all_wrong"}
    assert groups.height == 3 + 3  # 2 missing × 1.5 oversample, twice
    failing = {**never_solved, "dynamic_sampling": {**never_solved["dynamic_sampling"], "on_shortfall": "fail"}}
    with pytest.raises(BatchShortfall, match="after 2 generation rounds only 0 of 2 groups were informative"):
        rl_iteration(failing, iteration=1, lake_uri=lake_uri)
    assert lake.read("rollouts").height == 6 * 4  # what was sampled is kept ...
    assert lake.read("rewards").height == 6 * 4
    for table in ("groups", "advantages", "batches"):  # ... and the earlier run's batch is gone
        assert lake.read(table).is_empty(), table


def test_command_line_iteration_analysis_and_advantage_rerun(cli, tmp_path):
    lake_uri = str(tmp_path / "lake")
    config = tmp_path / "run.yaml"
    import yaml

    config.write_text(yaml.safe_dump({**CONFIG, "advantages": {"estimator": "grpo"}}))
    assert cli("curate", "--source", "gen:mix:60", "--lake", lake_uri).returncode == 0
    iterated = cli("iterate", "--config", str(config), "--lake", lake_uri)
    assert iterated.returncode == 0, iterated.stderr
    assert "groups kept / drawn" in iterated.stdout and "solve-rate histogram" in iterated.stdout
    analysed = cli("analyze", "sampling", "--iteration", "1", "--format", "json", "--lake", lake_uri)
    problems = pl.DataFrame([json.loads(line) for line in analysed.stdout.splitlines() if line.strip()])
    assert set(problems["zone"]) <= {"too_hard", "learning_zone", "too_easy"} and (problems["samples"] == 4).all()
    table = cli("analyze", "sampling", "--iteration", "1", "--lake", lake_uri)
    assert "correct vs incorrect responses" in table.stdout and "problems by zone" in table.stdout
    rerun = cli("advantages", "--iteration", "1", "--estimator", "rloo", "--config", str(config), "--lake", lake_uri)
    assert rerun.returncode == 0, rerun.stderr
    from storage.lake import Lake

    assert set(Lake.open(lake_uri).read("advantages")["estimator"]) == {"rloo"}
    missing = cli("analyze", "sampling", "--iteration", "7", "--lake", lake_uri)
    assert missing.returncode == 1 and "iteration 7 has no rollouts" in missing.stderr


def test_off_policy_rollouts_get_truncated_importance_weights_and_stale_ones_are_recorded(rl_iteration, tmp_path):
    import torch

    from flows.iteration import compute_advantages
    from policy.checkpoints import load_policy
    from policy.hf import sequence_logprobs
    from storage.lake import Lake
    from storage.registry import version_row

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    register_random_version(lake, 1, seed=11)  # the policy moved on by one version
    compute_advantages(1, CONFIG, lake_uri, model_version=1)
    rows = lake.read("advantages").join(lake.read("rollouts"), on="rollout_id").sort("rollout_id")
    assert set(rows["freshness"]) == {"acceptable"} and set(rows["staleness"]) == {1}
    model, _ = load_policy(version_row(lake, 1)["checkpoint_uri"])
    with torch.no_grad():
        current = [
            float(lp.sum())
            for lp in sequence_logprobs(model, rows["prompt_token_ids"].to_list(), rows["response_token_ids"].to_list())
        ]
    behaviour = rows["behaviour_logprobs"].list.sum().to_list()
    expected = [min(math.exp(c - b), 2.0) for c, b in zip(current, behaviour)]
    assert rows["importance_weight"].to_list() == pytest.approx(expected, rel=1e-4)
    batch = lake.read("batches").join(rows.select("rollout_id", "importance_weight"), on="rollout_id")
    assert batch["weight"].to_list() == pytest.approx(batch["importance_weight"].to_list())
    assert len(set(expected)) > 1  # not a constant in disguise

    too_old = {**CONFIG, "advantages": {"max_stale_versions": 0}}
    compute_advantages(1, too_old, lake_uri, model_version=1)
    recorded = lake.read("advantages")
    assert recorded.height == rows.height and set(recorded["freshness"]) == {"stale"}
    assert (recorded["loss_mask"] == 0).all() and lake.read("batches").is_empty() and lake.read("groups").is_empty()


def test_a_rerun_whose_advantage_stage_fails_leaves_no_batch_of_the_old_rollouts(rl_iteration, tmp_path):
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    old_seed = lake.read("rollouts")["seed"][0]
    reseeded = {**CONFIG, "rollout": {**CONFIG["rollout"], "seed": 1}, "advantages": {"verifier": "flipped"}}
    with pytest.raises(ValueError, match="have no reward from flipped"):
        rl_iteration(reseeded, iteration=1, lake_uri=lake_uri)
    assert lake.read("rollouts")["seed"][0] != old_seed
    for table in ("groups", "advantages", "batches", "dbb_state"):
        assert lake.read(table).is_empty(), table


def test_sampling_an_older_version_measures_staleness_against_the_latest(rl_iteration, tmp_path):
    from storage.lake import Lake
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    lake = Lake.open(lake_uri)
    ensure_base_policy(lake, BasePolicyConfig.model_validate(SMALL_POLICY))
    register_random_version(lake, 1, seed=5)
    result = rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri, model_version=0)
    assert result["model_version"] == 1 and set(lake.read("rollouts")["model_version"]) == {0}
    advantages = lake.read("advantages")
    assert set(advantages["freshness"]) == {"acceptable"} and set(advantages["staleness"]) == {1}
    assert advantages["importance_weight"].n_unique() > 1  # truncated weights, per rollout

    from flows.iteration import compute_advantages
    from tasks.advantages.stage import AdvantageConfig, off_policy_logprob_sums, scored_rollouts

    unweighted = AdvantageConfig(off_policy_weight="none")  # weight 1, and no model loaded for it
    assert off_policy_logprob_sums(lake, 1, scored_rollouts(lake, 1, None), unweighted, 1) is None
    compute_advantages(1, {**CONFIG, "advantages": unweighted.model_dump()}, lake_uri)
    again = lake.read("advantages")
    assert set(again["freshness"]) == {"acceptable"} and set(again["importance_weight"]) == {1.0}


def test_an_inference_server_failing_mid_iteration_keeps_the_rounds_already_sampled(rl_iteration, tmp_path):
    from helpers import Scripted, completion

    from policy.openai_backend import BackendUnavailable
    from storage.lake import Lake

    first_round = 5  # 3 groups wanted × 1.5 oversample
    server = Scripted(
        lambda body, count: (200, completion(body["n"])) if count <= first_round else (400, {"error": "gone"})
    )
    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    remote = {
        **CONFIG,
        "rollout": {
            **CONFIG["rollout"],
            "backend": "openai",
            "openai": {"endpoints": [server.url], "backoff_seconds": 0.05},
        },
        "verify": {"workers": 0, "verifier": "constant"},
    }  # every group all-correct: round 2 is needed
    try:
        with pytest.raises(BackendUnavailable, match="refused"):
            rl_iteration(remote, iteration=1, lake_uri=lake_uri)
    finally:
        server.close()
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts")
    assert rollouts.height == first_round * 4 and set(rollouts["round"]) == {1}
    assert lake.read("rewards").height == first_round * 4
    assert set(rollouts["backend"]) == {f"openai:{server.url}"} and rollouts["response"][0] == "42"


def test_command_line_errors_are_one_line(cli, tmp_path):
    lake_uri = str(tmp_path / "lake")
    config = tmp_path / "dead.yaml"
    config.write_text(
        "rollout:\n  backend: openai\n  openai: {endpoints: ['http://127.0.0.1:9'], max_retries: 1,"
        " backoff_seconds: 0.05}\n  base_policy: {tokenizer_corpus: 50}\n"
    )
    assert cli("curate", "--source", "gen:mix:40", "--lake", lake_uri).returncode == 0
    dead = cli("iterate", "--config", str(config), "--lake", lake_uri, env={"RLVR_RETRY_DELAYS": "0"})
    assert dead.returncode == 1 and "error: 2 attempts over 1 endpoint(s) failed" in dead.stderr
    assert "Traceback" not in dead.stdout + dead.stderr
    invalid = cli("iterate", "--group-size", "1", "--lake", lake_uri)
    assert invalid.returncode == 2 and "--group-size 1: Input should be greater than or equal to 2" in invalid.stderr
