"""Short-answer QA: normalised exact match and token F1 (SQuAD's normalisation)."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.verifiers.base import Verdict, register
from tasks.verifiers.extract import extract_answer

ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalise_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    return " ".join(ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalise_answer(prediction).split(), normalise_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not predicted or not expected:
        return float(predicted == expected)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def gold_answers(gold: Any) -> list[str]:
    """A string, a list, or a JSON list of acceptable answers."""
    if isinstance(gold, (list, tuple)):
        return [str(g) for g in gold]
    text = str(gold)
    if text.startswith("["):
        try:
            return [str(g) for g in json.loads(text)]
        except json.JSONDecodeError:
            pass
    return [text]


@register("qa")
@dataclass
class QAVerifier:
    reward_kind: str = "exact"  # exact | f1
    f1_threshold: float = 0.8  # `correct` for reward_kind f1
    name: str = "qa"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        answer, extractor = extract_answer(response)
        if answer is None:
            lines = [line for line in response.strip().splitlines() if line.strip()]
            answer, extractor = (lines[-1], "last_line") if lines else ("", None)
        golds = gold_answers(problem.get("answer") or "")
        exact = any(normalise_answer(answer) == normalise_answer(g) for g in golds)
        f1 = max(token_f1(answer, g) for g in golds)
        if self.reward_kind == "f1":
            return Verdict(
                f1, f1 >= self.f1_threshold, {"extracted": answer, "extractor": extractor, "exact": exact, "f1": f1}
            )
        return Verdict(float(exact), exact, {"extracted": answer, "extractor": extractor, "exact": exact, "f1": f1})
