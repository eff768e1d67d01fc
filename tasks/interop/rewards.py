"""The platform's verifiers as the reward functions of the trainers teams already use.

- **TRL**: `GRPOTrainer(reward_funcs=[PlatformReward()], train_dataset=load_from_disk(<rlvr export --to trl>))`.
  TRL calls it with keyword arguments: `prompts`, `completions` (text, or chat messages), `completion_ids`, and
  every dataset column as a list; it reads `answer`, `domain`, `verifier` and `problem_id` from the exported
  columns and returns one float per completion.
- **verl**: `custom_reward_function.path=<this file> custom_reward_function.name=compute_score`; verl calls
  `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` per response and reads `score` from
  the dict returned (the other keys become columns of its rollout dumps).

Math is judged by equivalence, code runs only in the sandbox (never in the trainer's process), each item within
the verifier pool's deadline. `PlatformReward(lake=…, run=…)` also records every call into the lake (TRL's step
as the iteration, `recording.py`), holding the lake's `loop` lease until `close()`; verl's responses reach the
lake through its rollout dumps (`rlvr import verl`), since `compute_score` sees one response and no step.
"""

from __future__ import annotations

import json

import polars as pl

from storage.lake import Lake
from storage.leases import LOOP
from tasks.interop.recording import Attempt, ExternalRun, external_problem_id
from tasks.verification.stage import VerifyConfig, score_rollouts, verifier_pool


def problem_from(
    ground_truth: str, domain: str | None = None, verifier: str | None = None, problem_id: str | None = None
) -> dict:
    """A problem row the verifiers read, from a trainer's ground truth (an exported answer, or code's tests and
    entry point as JSON) and the domain and verifier its dataset carries."""
    tests = entry_point = None
    if ground_truth.startswith("{"):
        try:
            code = json.loads(ground_truth)
            tests, entry_point = code["tests"], code.get("entry_point")
        except (ValueError, KeyError, TypeError):
            pass
    return {
        "problem_id": problem_id or "",
        "domain": domain or ("code" if tests else "math"),
        "answer": None if tests else ground_truth,
        "tests": tests,
        "entry_point": entry_point,
        "verifier": verifier or None,
        "prompt": "",
        "steps": None,
        "metadata": None,
        "params": None,
    }


def completion_text(completion) -> str:
    """TRL's completion: a text, or for chat data a list of messages whose last one the model wrote."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def score(problems: list[dict], responses: list[str], config: VerifyConfig, pool=None) -> pl.DataFrame:
    """Reward rows of each (problem, response) pair, scored by the problem's verifier (or `config.verifier`)."""
    frame = pl.DataFrame(
        [
            {**problem, "rollout_id": str(i), "iteration": 0, "response": response}
            for i, (problem, response) in enumerate(zip(problems, responses))
        ],
        infer_schema_length=None,
    )
    return score_rollouts(frame, config, pool)


def prompt_text(prompt) -> str:
    """TRL's prompt as the lake stores it: the text, or chat messages as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)


class PlatformReward:
    """A TRL reward function scored by the platform's verifiers; its column in TRL's logs is `rlvr_verifier`.
    With `lake` and `run`, each call's completions are recorded there as TRL run `run` (model name `model`)."""

    __name__ = "rlvr_verifier"

    def __init__(
        self,
        config: VerifyConfig | None = None,
        lake: str | Lake | None = None,
        run: str | None = None,
        model: str = "trl",
        iteration_offset: int = 0,
    ):
        self.config = config or VerifyConfig(workers=0)
        self._pool = None
        self.model = model
        self.recorder = None
        self._lease = None
        self._calls = 0
        if lake is not None:
            if run is None:
                raise ValueError("recording into the lake needs the run's name (`run=`)")
            opened = lake if isinstance(lake, Lake) else Lake.open(lake)
            self.recorder = ExternalRun(opened, run, "trl", iteration_offset)

    def __call__(
        self,
        prompts,
        completions,
        answer=None,
        domain=None,
        verifier=None,
        problem_id=None,
        completion_ids=None,
        trainer_state=None,
        **_,
    ) -> list[float]:
        if answer is None:
            raise ValueError(
                "the platform's reward needs the dataset's `answer` column: export it with `rlvr export --to trl`"
            )
        n = len(completions)
        problems = [
            problem_from(
                answer[i], (domain or [None] * n)[i], (verifier or [None] * n)[i], (problem_id or [None] * n)[i]
            )
            for i in range(n)
        ]
        if self._pool is None:
            self._pool = verifier_pool(self.config).start()
        responses = [completion_text(c) for c in completions]
        rewards = score(problems, responses, self.config, self._pool)
        step = trainer_state.global_step if trainer_state is not None else self._calls
        self._calls += 1
        if self.recorder is not None:
            self._record(step, prompts, responses, problems, completion_ids, rewards)
        return rewards["reward"].fill_null(0.0).to_list()

    def _record(self, step: int, prompts, responses, problems, completion_ids, rewards: pl.DataFrame) -> None:
        if self._lease is None:  # one writer of iterations per lake, as the loop
            self._lease = self.recorder.lake.lease(LOOP)
            self._lease.__enter__()
        ids = completion_ids or [None] * len(responses)
        attempts = [
            Attempt(
                step,
                self.model,
                prompt_text(prompt),
                response,
                problem["problem_id"] or external_problem_id(prompt_text(prompt), problem.get("answer") or ""),
                list(token_ids) if token_ids is not None else None,
            )
            for prompt, response, problem, token_ids in zip(prompts, responses, problems, ids)
        ]
        self.recorder.record(attempts, rewards)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._lease is not None:
            self._lease.__exit__(None, None, None)
            self._lease = None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **_) -> dict:
    """verl's custom reward function: {score, correct, verifier, problem_id} for one response (`rlvr export --to
    verl` puts the domain, verifier and problem id in `extra_info`; verl dumps every key, so `rlvr import verl`
    finds each response's problem)."""
    extra = extra_info or {}
    problem = problem_from(str(ground_truth), extra.get("domain"), extra.get("verifier"), extra.get("problem_id"))
    row = score([problem], [solution_str], VerifyConfig(workers=0)).row(0, named=True)
    return {
        "score": float(row["reward"] or 0.0),
        "correct": bool(row["correct"]),
        "verifier": row["verifier"],
        "problem_id": str(extra.get("problem_id") or ""),
    }
