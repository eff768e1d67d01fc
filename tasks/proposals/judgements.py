"""RISE's judgement tasks as text: the prompt asking whether a worked solution is right, the expected answer (the
verdict and, for a wrong solution, its first wrong step) and the reward of a judgement. Pure: the generators'
warm-up drill and the `self_verify` verifier share it."""

from __future__ import annotations

import json
import re

from tasks.verifiers.process import parse_number, stated_equalities, stated_is_true

JUDGEMENT = re.compile(r"\b(correct|wrong)\b(?:\s+at\s+step\s+(\d+))?", re.IGNORECASE)


def first_wrong_step(response: str, steps: list[str] | None) -> int | None:
    """1-based index of the first gold step whose result no true equality of the response produces, or None
    (no steps, or every step reached)."""
    results = [parse_number(step.rsplit("=", 1)[1]) for step in steps or [] if "=" in step]
    produced = {stated for _, stated, true in stated_equalities(response) if stated_is_true(stated, true)}
    for index, result in enumerate(results, start=1):
        if result is None or result not in produced:
            return index
    return None


def verification_prompt(problem: str, response: str) -> str:
    return (
        f"Problem: {problem}\nSolution:\n{response.strip()}\nIs the solution correct? Answer `correct`, or "
        "`wrong at step N` for its first wrong step.\n"
    )


def verification_answer(correct: bool, response: str, steps: list[str] | None) -> str:
    """The task's answer: the verdict, and the first wrong step of a wrong solution where steps are known."""
    step = None if correct else first_wrong_step(response, steps)
    return json.dumps({"correct": bool(correct), "wrong_step": step}, sort_keys=True)


def judged(response: str) -> tuple[bool | None, int | None]:
    """(verdict, step) of a verification response: its last `correct` / `wrong [at step N]`, or (None, None)."""
    found = JUDGEMENT.findall(response)
    if not found:
        return None, None
    verdict, step = found[-1]
    return verdict.lower() == "correct", int(step) if step else None


def judgement_reward(response: str, answer: str) -> tuple[float, bool | None, dict]:
    truth = json.loads(answer)
    verdict, step = judged(response)
    if verdict is None:
        return 0.0, False, {"reason": "no verdict"}
    if verdict != truth["correct"]:
        return 0.0, False, {"reason": "wrong verdict", "verdict": verdict}
    if verdict or truth["wrong_step"] is None or step == truth["wrong_step"]:
        return 1.0, True, {"reason": None, "verdict": verdict, "step": step}
    return 0.5, True, {"reason": "wrong step", "verdict": verdict, "step": step, "wrong_step": truth["wrong_step"]}
