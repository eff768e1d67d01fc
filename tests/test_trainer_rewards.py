"""The platform's verifiers as TRL's reward function and verl's `compute_score`: equivalent answers, code run
in the sandbox, chat completions, and TRL's own `GRPOTrainer` calling the function on a dataset from
`rlvr export --to trl`."""

import json

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
        assert reward(prompts=["q", "q"], completions=[right, wrong], answer=[ADD, ADD], domain=["code", "code"]) \
            == [1.0, 0.0]
    finally:
        reward.close()
    scored = compute_score("gen:code", right, ADD, {"domain": "code", "problem_id": "p1"})
    assert scored == {"score": 1.0, "correct": True, "verifier": "code"}
    assert compute_score("gen:code", wrong, ADD)["score"] == 0.0


def test_verl_compute_score_reads_what_the_verl_export_carries():
    assert compute_score("gen:two_step", "8*6 = 48, 48+42 = 90\n#### 90", "90",
                         {"split": "train", "index": 0, "problem_id": "9e66", "verifier": "math"})["score"] == 1.0
    assert compute_score("gen:two_step", "#### 91", "90")["correct"] is False


def test_trls_grpo_trainer_trains_with_the_platforms_reward(tmp_path):
    import warnings

    from datasets import load_from_disk
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from conftest import run_cli
    from flows.curation import curate_bank
    from storage.checkpoints import load_policy
    from storage.lake import Lake
    from storage.registry import version_row
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy
    from test_iteration import SMALL_POLICY

    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": 40, "seed": 0}]}, lake_uri)
    lake = Lake.open(lake_uri)
    ensure_base_policy(lake, BasePolicyConfig(**SMALL_POLICY))
    model, tokenizer = load_policy(version_row(lake, 0)["checkpoint_uri"])
    exported = tmp_path / "trl"
    assert run_cli("export", "--to", "trl", "--out", str(exported), "--no-chat", "--lake", lake_uri).returncode == 0
    seen = []

    class Seen(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(logs or {})

    reward = PlatformReward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8,
                          num_generations=4, max_completion_length=8, use_cpu=True, report_to=[], logging_steps=1,
                          save_strategy="no", disable_tqdm=True, bf16=False)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=load_from_disk(str(exported)),
                              processing_class=tokenizer, callbacks=[Seen()])
        try:
            trainer.train()
        finally:
            reward.close()
    logged = [log for log in seen if "rewards/rlvr_verifier/mean" in log]
    assert len(logged) == 2 and all(0.0 <= log["rewards/rlvr_verifier/mean"] <= 1.0 for log in logged)
