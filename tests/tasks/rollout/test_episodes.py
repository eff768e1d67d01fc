"""Multi-turn tool-use rollouts: episodes of model and tool turns, stored with a loss mask that keeps the
tool's tokens out of the policy loss; token-id continuation on both backends."""

from __future__ import annotations

import copy
import json
import threading

import polars as pl
import pytest
import torch

from policy.hf import HFPolicy
from policy.logprobs import response_logprobs
from policy.sampling import Sample, SamplerConfig
from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from tasks.rollout.base_policy import tokenizer_corpus
from tasks.rollout.episodes import PythonTool, ToolConfig, run_episodes, tool_call
from tasks.rollout.rows import rollout_rows
from trainers.grpo import TrainConfig, policy_tokens, train_on_batch

SCRIPT = [
    "Let me multiply. <python>print(12 * 7)</python>",
    "Check: <python>print(1 / 0)</python>",
    "So 84 + 5 = 89.\n#### 89",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(tokenizer_corpus(count=50))


@pytest.fixture(scope="module")
def tool():
    runner = PythonTool(seconds=5)
    yield runner
    runner.close()


class ScriptedPolicy:
    """Stands in for a model that writes SCRIPT's turns: the episode loop, the sandbox and the storage are
    what this exercises (the real backends' token-id continuation is tested below)."""

    def __init__(self, tokenizer, certainties=None):
        self.tokenizer, self.calls, self.prompts_seen = tokenizer, 0, []
        self.certainties = certainties  # each turn's self-certainty (None: the backend gives none)

    def generate(self, prompts, n, sampler, seed, model_version):
        text = SCRIPT[self.calls]
        self.calls += 1
        self.prompts_seen.append(prompts)
        assert "</python>" in sampler.stop
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        out = []
        for prompt in prompts:
            prompt_ids = (
                prompt if isinstance(prompt, list) else self.tokenizer(prompt, add_special_tokens=False).input_ids
            )
            out.append(
                [
                    Sample(
                        text=text,
                        token_ids=list(ids),
                        logprobs=[-0.5] * len(ids),
                        finish_reason="stop",
                        prompt_token_ids=list(prompt_ids),
                        backend="scripted",
                        self_certainty=self.certainties[self.calls - 1] if self.certainties else None,
                    )
                    for _ in range(n)
                ]
            )
        return out


def test_an_episode_with_two_tool_calls_is_stored_and_masked(tokenizer, tool):
    policy = ScriptedPolicy(tokenizer)
    tools = ToolConfig(enabled=True, max_turns=3, max_tool_calls=2)
    [[episode]] = run_episodes(
        policy,
        tokenizer,
        tool,
        ["What is 12*7+5?"],
        1,
        SamplerConfig(max_new_tokens=64),
        seed=0,
        model_version=0,
        tools=tools,
    )
    assert [turn["role"] for turn in episode.turns] == ["model", "tool", "model", "tool", "model"]
    assert episode.tool_calls == 2 and episode.tool_errors == 1
    assert "<output>\n84\n</output>" in episode.text and "ZeroDivisionError" in episode.turns[3]["text"]
    assert episode.text == tokenizer.decode(episode.token_ids) and episode.text.rstrip().endswith("#### 89")
    # the mask: 0 exactly on the tool's segments, whose behaviour log-probs are 0; 1 on the model's
    position = 0
    for turn in episode.turns:
        span = slice(position, position + turn["tokens"])
        assert set(episode.loss_mask[span]) == ({1} if turn["role"] == "model" else {0})
        assert set(episode.logprobs[span]) == ({-0.5} if turn["role"] == "model" else {0.0})
        position += turn["tokens"]
    assert position == len(episode.token_ids) == len(episode.loss_mask)
    # each continuation is the exact token ids so far: prompt, the model's tokens and the tool's
    prompt_ids = tokenizer("What is 12*7+5?", add_special_tokens=False).input_ids
    assert policy.prompts_seen[2] == [prompt_ids + episode.token_ids[: sum(t["tokens"] for t in episode.turns[:4])]]

    rows = rollout_rows(
        pl.DataFrame({"problem_id": ["p"]}),
        ["What is 12*7+5?"],
        [[episode]],
        iteration=1,
        round_=1,
        model_version=0,
        sampler={},
        seed=0,
    )
    row = rows.row(0, named=True)
    assert row["loss_mask"] == episode.loss_mask and row["tool_calls"] == 2 and row["tool_errors"] == 1
    assert [t["role"] for t in json.loads(row["turns"])] == ["model", "tool", "model", "tool", "model"]
    assert row["n_tokens"] == sum(episode.loss_mask) < len(episode.token_ids)  # the model's tokens only


def test_an_episodes_self_certainty_is_the_mean_over_every_model_turns_tokens(tokenizer, tool):
    """INTUITOR's reward of an episode: all its model turns, token-weighted (not the first turn's value); a turn
    without one leaves the episode without one (the reward then stops or falls back, as configured)."""
    tools = ToolConfig(enabled=True, max_turns=3, max_tool_calls=2)
    [[episode]] = run_episodes(
        ScriptedPolicy(tokenizer, certainties=[1.0, 2.0, 4.0]),
        tokenizer,
        tool,
        ["q"],
        1,
        SamplerConfig(max_new_tokens=64),
        seed=0,
        model_version=0,
        tools=tools,
    )
    tokens = [turn["tokens"] for turn in episode.turns if turn["role"] == "model"]
    assert episode.self_certainty == pytest.approx((1.0 * tokens[0] + 2.0 * tokens[1] + 4.0 * tokens[2]) / sum(tokens))
    [[unknown]] = run_episodes(
        ScriptedPolicy(tokenizer, certainties=[1.0, None, 4.0]),
        tokenizer,
        tool,
        ["q"],
        1,
        SamplerConfig(max_new_tokens=64),
        seed=0,
        model_version=0,
        tools=tools,
    )
    assert unknown.self_certainty is None


def test_episode_budgets_end_an_episode():
    assert tool_call("x <python>print(1)\n</python>", ToolConfig()) == "print(1)"
    assert tool_call("<python>print(1)</python> and more", ToolConfig()) is None  # a call must end the turn
    assert tool_call("no call", ToolConfig()) is None


def test_a_capped_episode_stops_calling_tools(tokenizer, tool):
    policy = ScriptedPolicy(tokenizer)
    [[episode]] = run_episodes(
        policy,
        tokenizer,
        tool,
        ["q"],
        1,
        SamplerConfig(max_new_tokens=64),
        seed=0,
        model_version=0,
        tools=ToolConfig(enabled=True, max_turns=2, max_tool_calls=1),
    )
    assert episode.tool_calls == 1 and [t["role"] for t in episode.turns] == ["model", "tool", "model"]


def test_training_on_episodes_puts_no_loss_on_the_tool_tokens(tokenizer):
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2), tokenizer)
    prompt = tokenizer("2*3+1?", add_special_tokens=False).input_ids
    model_part, tool_part, answer = (
        tokenizer(t, add_special_tokens=False).input_ids
        for t in ("<python>print(2*3)</python>", "\n<output>\n6\n</output>\n", "#### 7")
    )
    response = model_part + tool_part + answer
    mask = [1] * len(model_part) + [0] * len(tool_part) + [1] * len(answer)
    with torch.no_grad():
        logprobs, _, _ = response_logprobs(model, [prompt], [response])
    behaviour = [value if keep else 0.0 for value, keep in zip(logprobs[0].tolist(), mask)]

    def loss(behaviour_logprobs, with_mask=True):
        rows = pl.DataFrame(
            {
                "prompt_token_ids": [prompt],
                "response_token_ids": [response],
                "behaviour_logprobs": [behaviour_logprobs],
                "advantage": [1.0],
                "weight": [1.0],
                "temperature": [1.0],
                "loss_mask": [mask if with_mask else None],
            },
            schema_overrides={"loss_mask": pl.List(pl.Int8)},
        )
        metrics, _ = train_on_batch(copy.deepcopy(model), rows, TrainConfig(learning_rate=1e-3))
        return metrics

    other_tool_values = [value if keep else -7.0 for value, keep in zip(behaviour, mask)]
    masked, masked_other = loss(behaviour), loss(other_tool_values)
    assert masked["loss"] == pytest.approx(masked_other["loss"], abs=1e-7)  # tool tokens change nothing
    assert masked["grad_norm"] == pytest.approx(masked_other["grad_norm"], rel=1e-6)
    assert masked["tokens"] == sum(mask) < len(response)
    unmasked = loss(other_tool_values, with_mask=False)
    assert unmasked["loss"] != pytest.approx(masked["loss"], abs=1e-4)  # without the mask they would
    assert policy_tokens(pl.DataFrame({"response_token_ids": [[1, 2, 3], [4]], "loss_mask": [[1, 0, 1], None]})) == 3


def test_both_backends_continue_from_token_ids(tokenizer):
    from policy.openai_backend import OpenAIBackendConfig, OpenAIPolicy
    from policy.server import PolicyServer

    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2), tokenizer)
    local = HFPolicy(model, tokenizer, 0)
    ids = tokenizer("12*7=", add_special_tokens=False).input_ids
    greedy = SamplerConfig(temperature=0, max_new_tokens=6)
    [[from_ids]] = local.generate([ids], 1, greedy, seed=0, model_version=0)
    [[from_text]] = local.generate(["12*7="], 1, greedy, seed=0, model_version=0)
    assert from_ids.token_ids == from_text.token_ids and from_ids.prompt_token_ids == ids
    server = PolicyServer(("127.0.0.1", 0), lambda version: local, preload=(0,))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = OpenAIPolicy(
            OpenAIBackendConfig(
                endpoints=[f"http://127.0.0.1:{server.server_address[1]}"],
                model_name="v{model_version}",
                confirm_served=False,
            )
        )
        [[over_http]] = remote.generate([ids], 1, greedy, seed=0, model_version=0)
        remote.close()
    finally:
        server.shutdown()
    assert over_http.token_ids == from_ids.token_ids


def test_a_tool_error_shows_the_programs_own_frames_and_its_end():
    from tasks.rollout.episodes import shortened

    trace = (
        'Traceback (most recent call last):\n  File "/x/tasks/sandbox/zygote.py", line 264, in _fork\n    body()\n'
        '  File "<program>", line 1, in <module>\nZeroDivisionError: division by zero'
    )
    assert shortened(trace, 300, keep_end=True) == (
        'Traceback (most recent call last):\n  File "<program>", line 1, '
        "in <module>\nZeroDivisionError: division by zero"
    )
    assert shortened("x" * 50, 10, keep_end=True) == "…" + "x" * 10
    assert shortened("y" * 50, 10, keep_end=False) == "y" * 10 + "…"


def test_sql_asks_tool_calls_errors_and_solve_rate(tokenizer, tool, tmp_path):
    from storage.catalog import open_catalog
    from storage.lake import Lake
    from storage.runs import Run

    policy = ScriptedPolicy(tokenizer)
    groups = run_episodes(
        policy,
        tokenizer,
        tool,
        ["What is 12*7+5?"],
        2,
        SamplerConfig(max_new_tokens=64),
        seed=0,
        model_version=0,
        tools=ToolConfig(enabled=True),
    )
    lake, run = Lake.open(str(tmp_path / "lake")), Run(flow="test", stage="test", parameters={})
    rows = rollout_rows(
        pl.DataFrame({"problem_id": ["p"]}),
        ["What is 12*7+5?"],
        groups,
        iteration=1,
        round_=1,
        model_version=0,
        sampler={},
        seed=0,
    ).with_columns(run_id=pl.lit(run.run_id))
    lake.append("rollouts", rows, run)
    lake.append(
        "problems",
        pl.DataFrame(
            {
                "problem_id": ["p"],
                "bank_version": [1],
                "source": ["s"],
                "source_kind": ["generator"],
                "source_uri": ["g"],
                "split": ["train"],
                "domain": ["math"],
                "level": [1],
                "prompt": ["What is 12*7+5?"],
                "verifier": ["math"],
                "run_id": [run.run_id],
            },
            schema_overrides={"level": pl.Int8},
        ),
        run,
    )
    lake.append(
        "rewards",
        pl.DataFrame(
            {
                "iteration": [1, 1],
                "rollout_id": rows["rollout_id"].to_list(),
                "problem_id": ["p", "p"],
                "verifier": ["math", "math"],
                "verifier_version": ["2.2", "2.2"],
                "reward": [1.0, 0.0],
                "correct": [True, False],
                "run_id": [run.run_id] * 2,
            }
        ),
        run,
    )
    [row] = open_catalog(lake).sql("select * from tool_use").pl().to_dicts()
    assert row["episodes"] == 2 and row["calling_share"] == 1.0 and row["mean_tool_calls"] == 2.0
    assert row["tool_error_rate"] == 0.5 and row["solve_rate_with_calls"] == 0.5
