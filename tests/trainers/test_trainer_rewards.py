"""The platform's verifiers as TRL's reward function and verl's `compute_score`: equivalent answers, code run
in the sandbox, chat completions, and TRL's own `GRPOTrainer` calling the function on a dataset from
`rlvr export --to trl`."""

import json

import pyarrow.compute as pc
import pytest

from tasks.interop.rewards import PlatformReward, compute_score, problem_from

ADD = json.dumps({"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0", "entry_point": "add"})


def test_trl_reward_judges_equivalent_answers_and_reads_chat_completions():
    reward = PlatformReward()
    try:
        completions = ["so #### 0.5", "the answer is 1/2", "#### 3", [{"role": "assistant", "content": "#### 50%"}]]
        assert reward(prompts=["q"] * 4, completions=completions, answer=["1/2"] * 4) == [1.0, 1.0, 0.0, 1.0]
    finally:
        reward.close()
    with pytest.raises(ValueError, match="needs the dataset's `answer` column"):
        PlatformReward()(prompts=["q"], completions=["#### 1"])


def test_code_is_run_in_the_sandbox_by_both_entry_points():
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    assert problem_from(ADD)["domain"] == "code" and problem_from(ADD)["entry_point"] == "add"
    reward = PlatformReward()
    try:
        assert reward(prompts=["q", "q"], completions=[right, wrong], answer=[ADD, ADD], domain=["code", "code"]) == [
            1.0,
            0.0,
        ]
    finally:
        reward.close()
    scored = compute_score("gen:code", right, ADD, {"domain": "code", "problem_id": "p1"})
    assert scored == {"score": 1.0, "correct": True, "verifier": "code", "problem_id": "p1"}
    assert compute_score("gen:code", wrong, ADD)["score"] == 0.0


def test_verl_compute_score_reads_what_the_verl_export_carries():
    assert (
        compute_score(
            "gen:two_step",
            "8*6 = 48, 48+42 = 90\n#### 90",
            "90",
            {"split": "train", "index": 0, "problem_id": "9e66", "verifier": "math"},
        )["score"]
        == 1.0
    )
    assert compute_score("gen:two_step", "#### 91", "90")["correct"] is False


def test_trls_grpo_trainer_trains_with_the_platforms_reward_and_its_rollouts_land_in_the_lake(tmp_path):
    """TRL's own trainer, two steps on the tiny model, the reward recording into the lake: the completions are
    then found with `rlvr sql`, re-scored with another verifier and walked back with `rlvr lineage`."""
    import warnings

    from conftest import run_cli
    from datasets import load_from_disk
    from helpers import SMALL_POLICY
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from flows.curation import curate_bank
    from policy.checkpoints import load_policy
    from storage.lake import Lake
    from storage.registry import version_row
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": 40, "seed": 0}]}, lake_uri)
    policies = Lake.open(str(tmp_path / "policies"))  # the platform's own versions live apart from TRL's run
    ensure_base_policy(policies, BasePolicyConfig(**SMALL_POLICY))
    model, tokenizer = load_policy(version_row(policies, 0)["checkpoint_uri"])
    exported = tmp_path / "trl"
    assert run_cli("export", "--to", "trl", "--out", str(exported), "--no-chat", "--lake", lake_uri).returncode == 0
    seen = []

    class Seen(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(logs or {})

    with pytest.raises(ValueError, match="needs the run's name"):
        PlatformReward(lake=lake_uri)
    reward = PlatformReward(lake=lake_uri, run="trl-run", model="tiny-grpo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            max_steps=2,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            use_cpu=True,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            bf16=False,
            log_completions=True,
            num_completions_to_print=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=load_from_disk(str(exported)),
            processing_class=tokenizer,
            callbacks=[Seen()],
        )
        try:
            trainer.train()
        finally:
            reward.close()
    logged = [log for log in seen if "rewards/rlvr_verifier/mean" in log]
    assert len(logged) == 2 and all(0.0 <= log["rewards/rlvr_verifier/mean"] <= 1.0 for log in logged)

    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts")
    assert rollouts.height == 16 and sorted(set(rollouts["iteration"])) == [0, 1]  # 8 completions a step
    assert rollouts["response_token_ids"].list.len().min() >= 1 and set(rollouts["backend"]) == {"trl"}
    bank = set(lake.read("problems")["problem_id"])
    assert set(rollouts["problem_id"]) <= bank  # the exported ids lead back to the bank
    sql = run_cli(
        "sql",
        "--lake",
        lake_uri,
        "--format",
        "json",
        "select g.iteration, g.problem_id, g.solve_rate, g.n_samples from groups g join runs u "
        "on g.run_id = u.run_id where u.flow = 'external:trl-run' order by 1, 2",
    )
    assert sql.returncode == 0, sql.stderr
    groups = [json.loads(line) for line in sql.stdout.splitlines() if line.strip()]
    assert sum(group["n_samples"] for group in groups) == 16 and all(group["n_samples"] == 4 for group in groups)
    assert sum(group["solve_rate"] * 4 for group in groups) == lake.read("rewards")["correct"].sum()
    rescored = run_cli("stage", "verify", "--iteration", "1", "--verifier", "exact", "--lake", lake_uri)
    assert rescored.returncode == 0, rescored.stderr + rescored.stdout
    assert lake.read("rewards", filter=pc.field("verifier") == "exact").height == 8
    lineage = run_cli("lineage", "model-version", "1", "--lake", lake_uri)
    assert lineage.returncode == 0 and "external, parent 0, iteration 1" in lineage.stdout
    assert "tiny-grpo" in lineage.stdout

    # TRL's own log of the same completions, imported as a run of its own past the first one's iterations
    logged_files = sorted((tmp_path / "out" / "completions").glob("completions_*.parquet"))
    assert len(logged_files) == 2
    imported = run_cli(
        "import",
        "trl",
        str(tmp_path / "out"),
        "--run",
        "trl-logged",
        "--iteration-offset",
        "100",
        "--lake",
        lake_uri,
        "--format",
        "json",
    )
    assert imported.returncode == 0, imported.stderr
    assert [json.loads(line)["rollouts"] for line in imported.stdout.splitlines()] == [8, 8]
    logged = lake.read("rollouts", filter=pc.field("iteration") >= 100)
    assert sorted(set(logged["iteration"])) == [101, 102] and set(logged["problem_id"]) <= bank
    assert sorted(zip(logged["prompt"], logged["response"])) == sorted(zip(rollouts["prompt"], rollouts["response"]))
    trl_rewards = lake.read("rewards", filter=pc.field("iteration") >= 100)
    assert (
        set(trl_rewards["verifier"]) == {"rlvr_verifier"}
        and trl_rewards["reward"].sum()
        == lake.read("rewards", filter=(pc.field("iteration") < 100) & (pc.field("verifier") != "exact"))[
            "reward"
        ].sum()
    )
    assert lake.read("advantages", filter=pc.field("estimator") == "trl").height == 16
    again = run_cli(
        "import",
        "trl",
        str(tmp_path / "out"),
        "--run",
        "trl-logged",
        "--iteration-offset",
        "100",
        "--lake",
        lake_uri,
        "--format",
        "json",
    )
    assert [json.loads(line)["status"] for line in again.stdout.splitlines()] == ["imported before"] * 2
    assert lake.read("rollouts", filter=pc.field("iteration") >= 100).height == 16
    import polars as pl  # TRL logs a batch again at a later logging step

    relogged = pl.read_parquet(logged_files[0]).with_columns(step=pl.lit(3, pl.Int64))
    relogged.write_parquet(tmp_path / "out" / "completions" / "completions_00003.parquet")
    third = run_cli(
        "import",
        "trl",
        str(tmp_path / "out"),
        "--run",
        "trl-logged",
        "--iteration-offset",
        "100",
        "--lake",
        lake_uri,
        "--format",
        "json",
    )
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout.splitlines()[-1])["rollouts"] == 0
    assert "8 logged before or unscorable, skipped" in json.loads(third.stdout.splitlines()[-1])["status"]
    assert lake.read("rollouts", filter=pc.field("iteration") >= 100).height == 16
