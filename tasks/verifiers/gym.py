"""Logic and procedural problems: the generating dataset's own scorer (reasoning-gym `score_answer`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.verifiers.base import Verdict, register
from tasks.verifiers.extract import extract_answer

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def gym_answer(response: str) -> tuple[str | None, str | None]:
    """reasoning-gym's `<answer>...</answer>` convention first, then the math extractors."""
    tags = ANSWER_TAG.findall(response)
    if tags:
        return tags[-1].strip(), "answer_tag"
    return extract_answer(response)


@register("gym")
@dataclass
class GymVerifier:
    correct_threshold: float = 1.0
    name: str = "gym"
    version: str = "1.0"
    _datasets: dict = field(default_factory=dict, repr=False)

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        metadata = _json(problem.get("metadata"))
        params = _json(problem.get("params"))
        dataset_name = params.get("dataset") or metadata.get("source_dataset") or problem.get("dataset")
        if not dataset_name:
            return Verdict(0.0, None, {"reason": "no reasoning-gym dataset named in params or metadata"})
        answer, extractor = gym_answer(response)
        if answer is None:
            return Verdict(0.0, False, {"reason": "no final answer", "extracted": None})
        entry = {"question": problem.get("prompt", ""), "answer": problem.get("answer"), "metadata": metadata}
        score = float(self._dataset(dataset_name, params.get("config") or {}).score_answer(answer, entry))
        return Verdict(
            score,
            score >= self.correct_threshold,
            {"extracted": answer, "extractor": extractor, "dataset": dataset_name, "score": score},
        )

    def _dataset(self, name: str, config: dict):
        key = (name, json.dumps(config, sort_keys=True))
        if key not in self._datasets:
            import reasoning_gym

            self._datasets[key] = reasoning_gym.create_dataset(name, size=1, seed=0, **config)
        return self._datasets[key]


def _json(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
            return parsed if isinstance(parsed, dict) else {}
        except json.JSONDecodeError:
            return {}
    return {}
