"""The platform's verifiers as the reward functions of the trainers teams already use.

- **TRL**: `GRPOTrainer(reward_funcs=[PlatformReward()], train_dataset=load_from_disk(<rlvr export --to trl>))`.
  TRL calls it with keyword arguments: `prompts`, `completions` (text, or chat messages), `completion_ids`, and
  every dataset column as a list; it reads `answer`, `domain`, `verifier` and `problem_id` from the exported
  columns and returns one float per completion.
- **verl**: `custom_reward_function.path=<this file> custom_reward_function.name=compute_score`; verl calls
  `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` per response and reads `score` from
  the dict returned (the other keys become columns of its rollout dumps).

Math is judged by equivalence, code runs only in the sandbox (never in the trainer's process), each item within
the verifier pool's deadline. Writing what they score into the lake is not done here yet.
"""

from __future__ import annotations

import json

import polars as pl

from tasks.verification import VerifyConfig, score_rollouts, verifier_pool


def problem_from(ground_truth: str, domain: str | None = None, verifier: str | None = None,
                 problem_id: str | None = None) -> dict:
    """A problem row the verifiers read, from a trainer's ground truth (an exported answer, or code's tests and
    entry point as JSON) and the domain and verifier its dataset carries."""
    tests = entry_point = None
    if ground_truth.startswith("{"):
        try:
            code = json.loads(ground_truth)
            tests, entry_point = code["tests"], code.get("entry_point")
        except (ValueError, KeyError, TypeError):
            pass
    return {"problem_id": problem_id or "", "domain": domain or ("code" if tests else "math"),
            "answer": None if tests else ground_truth, "tests": tests, "entry_point": entry_point,
            "verifier": verifier or None, "prompt": "", "steps": None, "metadata": None, "params": None}


def completion_text(completion) -> str:
    """TRL's completion: a text, or for chat data a list of messages whose last one the model wrote."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def score(problems: list[dict], responses: list[str], config: VerifyConfig, pool=None) -> pl.DataFrame:
    """Reward rows of each (problem, response) pair, scored by the problem's verifier (or `config.verifier`)."""
    frame = pl.DataFrame([{**problem, "rollout_id": str(i), "iteration": 0, "response": response}
                          for i, (problem, response) in enumerate(zip(problems, responses))],
                         infer_schema_length=None)
    return score_rollouts(frame, config, pool)


class PlatformReward:
    """A TRL reward function scored by the platform's verifiers; its column in TRL's logs is `rlvr_verifier`."""

    __name__ = "rlvr_verifier"

    def __init__(self, config: VerifyConfig | None = None):
        self.config = config or VerifyConfig(workers=0)
        self._pool = None

    def __call__(self, prompts, completions, answer=None, domain=None, verifier=None, problem_id=None,
                 **_) -> list[float]:
        if answer is None:
            raise ValueError("the platform's reward needs the dataset's `answer` column: export it with "
                             "`rlvr export --to trl`")
        n = len(completions)
        problems = [problem_from(answer[i], (domain or [None] * n)[i], (verifier or [None] * n)[i],
                                 (problem_id or [None] * n)[i]) for i in range(n)]
        if self._pool is None:
            self._pool = verifier_pool(self.config).start()
        rewards = score(problems, [completion_text(c) for c in completions], self.config, self._pool)
        return rewards["reward"].fill_null(0.0).to_list()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **_) -> dict:
    """verl's custom reward function: {score, correct, verifier} for one response (`rlvr export --to verl` puts the
    domain and verifier in `extra_info`)."""
    extra = extra_info or {}
    problem = problem_from(str(ground_truth), extra.get("domain"), extra.get("verifier"), extra.get("problem_id"))
    row = score([problem], [solution_str], VerifyConfig(workers=0)).row(0, named=True)
    return {"score": float(row["reward"] or 0.0), "correct": bool(row["correct"]), "verifier": row["verifier"]}
