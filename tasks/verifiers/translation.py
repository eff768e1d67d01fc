"""Translation against a reference: a continuous reward, chrF (default) or BLEU, with sacrebleu.

The translation is the `<answer>…</answer>` block, else a `Translation:` line, else the response's last
non-empty line. Reward = the sentence score / 100 against the reference (several references may be
given, as a JSON list); `correct` = the reward reaches `correct_threshold`. Guards: an empty answer,
an answer that copies the source sentence instead of translating it, and one padded to several times
the reference's length (to game chrF's recall) score 0. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.verifiers.base import Verdict, failed, register

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
PREFIX = re.compile(r"^\s*translation\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
SOURCE = re.compile(r"Translate into [A-Za-z]+:\s*\n(.+?)\n", re.DOTALL)


def translation_of(response: str) -> str:
    tagged = ANSWER.findall(response)
    if tagged:
        return tagged[-1].strip()
    prefixed = PREFIX.findall(response)
    if prefixed:
        return prefixed[-1].strip()
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def references_of(answer: Any) -> list[str]:
    if isinstance(answer, list):
        return [str(a) for a in answer]
    text = str(answer or "")
    if text.startswith("["):
        try:
            parsed = json.loads(text)
            if isinstance(parsed, list):
                return [str(a) for a in parsed]
        except json.JSONDecodeError:
            pass
    return [text] if text else []


def source_of(problem: Mapping[str, Any]) -> str | None:
    params = problem.get("params")
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except json.JSONDecodeError:
            params = None
    if isinstance(params, dict) and params.get("source_text"):
        return str(params["source_text"])
    match = SOURCE.search(str(problem.get("prompt") or ""))
    return match.group(1).strip() if match else None


@register("translation")
@dataclass
class TranslationVerifier:
    """Reward = chrF (or BLEU) / 100 against the reference; `correct` at `correct_threshold`."""

    metric: str = "chrf"  # chrf | bleu
    correct_threshold: float = 0.7
    copy_threshold: float = 0.8  # an answer this close to the source, and no closer to the reference, copies it
    max_length_ratio: float = 3.0  # answers longer than this many times the longest reference score 0
    name: str = "translation"
    version: str = "1.0"

    def __post_init__(self) -> None:
        if self.metric not in ("chrf", "bleu"):
            raise ValueError(f"metric must be chrf or bleu, not {self.metric!r}")

    def score(self, hypothesis: str, references: list[str]) -> float:
        import sacrebleu

        scorer = sacrebleu.sentence_chrf if self.metric == "chrf" else sacrebleu.sentence_bleu
        return scorer(hypothesis, references).score / 100.0

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        references = references_of(problem.get("answer"))
        if not references:
            return Verdict(0.0, None, {"reason": "problem has no reference translation"})
        hypothesis = translation_of(response)
        if not hypothesis.strip():
            return failed("no translation")
        if len(hypothesis) > self.max_length_ratio * max(len(r) for r in references):
            return failed("far longer than the reference", length=len(hypothesis))
        reward = self.score(hypothesis, references)
        source = source_of(problem)
        if source is not None:
            copied = self.score(hypothesis, [source])
            if copied >= self.copy_threshold and copied >= reward:
                return failed("copies the source instead of translating it", source_similarity=round(copied, 4))
        return Verdict(
            reward, reward >= self.correct_threshold, {"metric": self.metric, "extracted": hypothesis, "reason": None}
        )
