"""`rlvr bench judge-guard`: how often the judge's injection guard refuses ordinary text, and how often it catches
a response that addresses its grader.

A refused response scores 0 without being judged, so a false positive is a correct answer punished: the guard
is measured on a labelled set (`bench/data/judge_guard.jsonl`: responses that address the grader, every form of
score statement the judge's parser reads among them, and ordinary ones that talk about scores, grades, judges,
rules and maxima; a case's optional `note` says why it is labelled as it is) and, where `../shared/datasets` is present, on
real worked solutions (GSM8K's training answers, Minerva's and OlympiadBench's solutions), every one benign.
The guard before this measurement (`PREVIOUS_GUARD`, kept here as the baseline) is measured on the same texts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from flows.display import console

DEPENDS_ON = ("bench/judge_guard.py", "bench/data/judge_guard.jsonl", "tasks/verifiers/judge.py")
LABELLED = Path(__file__).resolve().parent / "data" / "judge_guard.jsonl"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
PREVIOUS_GUARD = re.compile(
    r"\b(?:ignore|disregard|forget|override)\b[^.\n]{0,40}\b(?:rubric|instructions?|rules|prompt|guidelines)\b"
    r"|\b(?:score|rating|grade|marks)\b[^.\n]{0,25}\b(?:10|ten|full|maximum|perfect|highest)\b"
    r"|\b(?:full|maximum|perfect|highest)\b[^.\n]{0,15}\b(?:score|rating|grade|marks)\b"
    r"|^\s*score\s*[:=]\s*\d+"
    r"|\bas (?:the|an|a) (?:judge|grader|evaluator|reviewer)\b"
    r"|\b(?:dear|hey|to the|attention|note to the) (?:judge|grader|evaluator)\b"
    r"|^\s*(?:judge|grader|evaluator)\s*[,:]",
    re.IGNORECASE | re.MULTILINE,
)


def labelled() -> list[dict]:
    return [json.loads(line) for line in LABELLED.read_text().splitlines() if line.strip()]


def real_solutions() -> dict[str, list[str]]:
    """Worked solutions from the shared datasets, by source; empty where they are absent."""
    sources = {
        "gsm8k": ("gsm8k/train.jsonl", "answer"),
        "minerva_math": ("minerva_math/test.jsonl", "solution"),
        "olympiadbench": ("olympiadbench/test.jsonl", "solution"),
    }
    found = {}
    for name, (path, field) in sources.items():
        if (SHARED / path).exists():
            texts = []
            for line in (SHARED / path).read_text().splitlines():
                value = json.loads(line).get(field) if line.strip() else None
                texts += [str(v) for v in value] if isinstance(value, list) else [str(value)] if value else []
            found[name] = texts
    return found


def measure(guard: re.Pattern, cases: list[dict], solutions: dict[str, list[str]]) -> dict:
    flagged = [bool(guard.search(case["text"])) for case in cases]
    benign = [f for f, case in zip(flagged, cases) if not case["injected"]]
    injected = [f for f, case in zip(flagged, cases) if case["injected"]]
    real = [text for texts in solutions.values() for text in texts]
    real_hits = [text for text in real if guard.search(text)]
    return {
        "false_positive_rate": sum(benign) / len(benign),
        "detection_rate": sum(injected) / len(injected),
        "false_positives": [case["text"] for f, case in zip(flagged, cases) if f and not case["injected"]],
        "missed": [case["text"] for f, case in zip(flagged, cases) if not f and case["injected"]],
        "real_solutions": len(real),
        "real_false_positives": len(real_hits),
        "real_false_positive_rate": len(real_hits) / len(real) if real else None,
        "real_examples": [text[:200] for text in real_hits[:5]],
    }


def run_benchmark() -> dict:
    from tasks.verifiers.judge import ADDRESSES_THE_JUDGE

    cases, solutions = labelled(), real_solutions()
    figures = {
        "benign": sum(not c["injected"] for c in cases),
        "injected": sum(c["injected"] for c in cases),
        "real_sources": {name: len(texts) for name, texts in solutions.items()},
        **measure(ADDRESSES_THE_JUDGE, cases, solutions),
        "previous": measure(PREVIOUS_GUARD, cases, solutions),
    }
    report(figures)
    return figures


def report(figures: dict) -> None:
    for label, row in (("guard", figures), ("previous guard", figures["previous"])):
        real = (
            f"; {row['real_false_positives']} of {row['real_solutions']:,} real solutions refused"
            if row["real_solutions"]
            else ""
        )
        console.print(
            f"{label}: {row['false_positive_rate']:.1%} of {figures['benign']} benign responses refused, "
            f"{row['detection_rate']:.1%} of {figures['injected']} injected caught{real}"
        )
