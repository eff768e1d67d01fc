"""Multi-turn tool-use rollouts: a rollout is an episode of model turns and tool turns.

The model writes; when a turn ends with a tool call (`<python>code</python>`), the code runs in the
sandbox (never here), its output is appended as `<output>...</output>`, and the model continues from
the exact token ids so far — prompt, its own tokens, the tool's — up to `max_turns` model turns,
`max_tool_calls` calls and `max_episode_tokens` response tokens. The episode is one rollout: its
response tokens are every segment's in order, `loss_mask` is 0 on the tool's tokens (the policy
loss never sees them; their behaviour log-probs are stored as 0) and 1 on the model's, and `turns`
records each segment. The final answer is verified from the whole episode as for any rollout.

Works with any `Policy` whose `generate` accepts token-id prompts (the hf backend, and the openai
backend: vLLM's completions API takes token ids). The tool's interface is `Tool.run(code) ->
ToolResult`; the Python executor is the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import Field

from policy.sampling import Policy, Sample, SamplerConfig
from storage.config import Strict
from storage.seeds import derive_seed
from tasks.sandbox.client import Sandbox
from tasks.sandbox.limits import SandboxLimits


class ToolConfig(Strict):
    """Tool use during rollout (`rollout.tools`)."""

    enabled: bool = Field(False, description="sample episodes: model turns with tool calls run in the sandbox")
    max_turns: int = Field(3, ge=1, le=16, description="model turns per episode (the first one included)")
    max_tool_calls: int = Field(2, ge=0, description="tool calls per episode; a call past it ends the episode")
    max_episode_tokens: int = Field(512, ge=1, description="response tokens of the whole episode, the tool's included")
    max_output_chars: int = Field(300, ge=1, description="a tool's output is cut to this many characters")
    call_open: str = Field("<python>", description="what opens a tool call in the model's text")
    call_close: str = Field("</python>", description="what closes it (a stop string of every model turn)")
    seconds: float = Field(3.0, gt=0, description="wall-clock limit of one tool call")


@dataclass(frozen=True)
class ToolResult:
    output: str
    error: bool


class PythonTool:
    """Runs a tool call's code as a script in the sandbox; its stdout and stderr are the output."""

    def __init__(self, seconds: float = 3.0):

        self.limits = SandboxLimits(
            cpu_seconds=max(1, int(seconds)),
            wall_seconds=seconds,
            memory_mb=256,
            scratch_mb=16,
            processes=4,
            output_bytes=64_000,
        )
        self.sandbox = Sandbox(limits=self.limits)

    def run(self, code: str) -> ToolResult:
        result = self.sandbox.run_script(code, self.limits)
        error = result.status != "ok" or result.exit_code not in (0, None)
        output = result.output if result.status == "ok" else f"{result.output}\n[{result.status}]".strip()
        return ToolResult(output, error)

    def close(self) -> None:
        self.sandbox.close()


@dataclass
class Episode:
    """One rollout being built: the response's tokens, log-probs, loss mask and segments so far."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    finish_reason: str = "stop"
    pending_call: str | None = None  # the code of a tool call the last model turn ended with
    self_certainty: float | None = None  # over every model turn's tokens; None when a turn had none
    backend: str = ""
    _certainty_sum: float = 0.0
    _certainty_tokens: int = 0
    _certainty_missing: bool = False

    def add_model(self, sample: Sample, tokenizer, tools: ToolConfig) -> None:
        text = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        self.token_ids += sample.token_ids
        self.logprobs += sample.logprobs
        self.loss_mask += [1] * len(sample.token_ids)
        self.turns.append({"role": "model", "text": text, "tokens": len(sample.token_ids)})
        self.finish_reason = sample.finish_reason
        self.backend = sample.backend
        if sample.self_certainty is None:
            self._certainty_missing = True
        else:
            self._certainty_sum += sample.self_certainty * len(sample.token_ids)
            self._certainty_tokens += len(sample.token_ids)
        self.self_certainty = (
            None
            if self._certainty_missing or not self._certainty_tokens
            else self._certainty_sum / self._certainty_tokens
        )
        self.pending_call = tool_call(text, tools) if sample.finish_reason == "stop" else None

    def add_tool(self, result: ToolResult, tokenizer, tools: ToolConfig) -> None:
        output = shortened(result.output, tools.max_output_chars, keep_end=result.error)
        text = f"\n<output>\n{output.rstrip()}\n</output>\n"
        ids = tokenizer(text, add_special_tokens=False).input_ids
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.turns.append({"role": "tool", "text": text, "tokens": len(ids), "error": result.error})
        self.tool_calls += 1
        self.tool_errors += int(result.error)
        self.pending_call = None

    def sample(self, tokenizer) -> Sample:
        return Sample(
            text=tokenizer.decode(self.token_ids, skip_special_tokens=True),
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            prompt_token_ids=self.prompt_ids,
            self_certainty=self.self_certainty,
            backend=self.backend,
            loss_mask=self.loss_mask,
            turns=self.turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
        )


def shortened(output: str, limit: int, keep_end: bool) -> str:
    """A tool's output within `limit` characters: its start, or for an error its end (where the exception is);
    a traceback shows the program's own frames, not the sandbox's."""
    if keep_end and "Traceback (most recent call last):" in output:
        head, _, frames = output.rpartition("Traceback (most recent call last):")
        own = frames[frames.find('  File "<program>"') :] if '  File "<program>"' in frames else frames
        output = head + "Traceback (most recent call last):\n" + own.lstrip("\n")
    if len(output) <= limit:
        return output
    return "…" + output[-limit:] if keep_end else output[:limit] + "…"


def tool_call(text: str, tools: ToolConfig) -> str | None:
    """The code of the tool call a model turn ends with, or None."""
    match = re.search(re.escape(tools.call_open) + r"(.*?)" + re.escape(tools.call_close) + r"\s*$", text, re.DOTALL)
    return match.group(1).strip("\n") if match else None


def run_episodes(
    policy: Policy,
    tokenizer,
    tool,
    prompts: list[str],
    n: int,
    sampler: SamplerConfig,
    seed: int,
    model_version: int,
    tools: ToolConfig,
) -> list[list[Sample]]:
    """`n` episodes per prompt, grouped like `Policy.generate`'s samples."""
    turn_sampler = sampler.model_copy(
        update={
            "stop": [*sampler.stop, tools.call_close],
            "max_new_tokens": min(sampler.max_new_tokens, tools.max_episode_tokens),
        }
    )
    groups = policy.generate(prompts, n, turn_sampler, seed, model_version)
    episodes = []
    for group in groups:
        for sample in group:
            episode = Episode(prompt_ids=list(sample.prompt_token_ids or []))
            episode.add_model(sample, tokenizer, tools)
            episodes.append(episode)
    for turn in range(1, tools.max_turns):
        calling = [e for e in episodes if e.pending_call is not None and e.tool_calls < tools.max_tool_calls]
        for episode in calling:
            episode.add_tool(tool.run(episode.pending_call), tokenizer, tools)
        going = [e for e in calling if len(e.token_ids) < tools.max_episode_tokens]
        going_ids = {id(e) for e in going}
        for episode in calling:
            if id(episode) not in going_ids:  # the tool's output used up the budget
                episode.finish_reason = "length"
        if not going:
            break
        budget = min(sampler.max_new_tokens, tools.max_episode_tokens - max(len(e.token_ids) for e in going))
        next_sampler = turn_sampler.model_copy(update={"max_new_tokens": max(1, budget)})
        continued = policy.generate(
            [e.prompt_ids + e.token_ids for e in going], 1, next_sampler, derive_seed(seed, "turn", turn), model_version
        )
        for episode, (sample,) in zip(going, continued):
            episode.add_model(sample, tokenizer, tools)
    samples = [episode.sample(tokenizer) for episode in episodes]
    return [samples[i * n : (i + 1) * n] for i in range(len(groups))]


@dataclass
class EpisodePolicy:
    """A policy whose `generate` samples episodes: what the rollout stage uses when `rollout.tools` is on."""

    policy: Policy
    tokenizer: object
    tools: ToolConfig
    tool: object = None

    def __post_init__(self):
        if self.tool is None:
            self.tool = PythonTool(self.tools.seconds)

    def generate(self, prompts, n: int, sampler: SamplerConfig, seed: int, model_version: int) -> list[list[Sample]]:
        return run_episodes(
            self.policy, self.tokenizer, self.tool, prompts, n, sampler, seed, model_version, self.tools
        )

    def close(self) -> None:
        getattr(self.tool, "close", lambda: None)()
        getattr(self.policy, "close", lambda: None)()
