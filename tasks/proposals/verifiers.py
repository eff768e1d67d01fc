"""Self-play code tasks (Absolute Zero): the solver's answer judged by execution in the sandbox
(`selfplay`), and a proposer's response judged by the validity rules (`proposal`, for held-out
evaluation of the proposer: 1 when the proposal is valid, else 0 with the rule it broke); SPICE's
challenger likewise against its document (`challenge`).

A self-play problem's `answer` is its `CodeTask` as JSON (program, inputs, the outputs the sandbox
computed when the proposal was validated, how many induction pairs are shown); the solver answers
in a fenced block: ```output``` (deduction), ```input``` (abduction) or ```python``` (induction).
See `tasks/selfplay/executor.judge_answer` for what each is checked against. Reward 1 or 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.errors import VerifierUnavailable
from tasks.proposals.code_tasks import TASK_TYPES, CodeTask, Rejection, last_block, parse_proposal
from tasks.proposals.documents import Document, parse_challenge
from tasks.proposals.executor import PROPOSAL_LIMITS, judge_answer, validate
from tasks.proposals.judgements import judgement_reward
from tasks.sandbox.client import Sandbox
from tasks.verifiers.base import Verdict, register

ANSWER_BLOCKS = {"deduction": ("output",), "abduction": ("input",), "induction": ("python", "py", "")}


@register("selfplay")
@dataclass
class SelfPlayVerifier:
    name: str = "selfplay"
    version: str = "1.0"
    runs_code = True  # proposed programs and solver programs: only in the sandbox
    _sandbox: Sandbox | None = field(default=None, repr=False)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(limits=PROPOSAL_LIMITS)
        return self._sandbox

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        try:
            task = CodeTask.from_json(problem.get("answer") or "")
        except (ValueError, KeyError, TypeError):
            return Verdict(0.0, None, {"reason": "the problem holds no self-play task"})
        solved, reason = judge_answer(self.sandbox, task, last_block(response, ANSWER_BLOCKS[task.task_type]))
        return Verdict(
            1.0 if solved else 0.0,
            solved,
            {"task_type": task.task_type, "reason": reason, "isolation": self.sandbox.description},
        )

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()


@register("proposal")
@dataclass
class ProposalVerifier:
    """A proposer's response: valid (1) or not (0, with the reason). The problem's `answer` is the task type.
    Duplicates of earlier proposals are not judged here (the self-play stage knows the history)."""

    name: str = "proposal"
    version: str = "1.0"
    runs_code = True
    _sandboxes: tuple[Sandbox, Sandbox] | None = field(default=None, repr=False)

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        task_type = problem.get("answer")
        if task_type not in TASK_TYPES:
            return Verdict(0.0, None, {"reason": f"the problem names no task type ({task_type!r})"})
        if self._sandboxes is None:
            self._sandboxes = (Sandbox(0, PROPOSAL_LIMITS), Sandbox(1, PROPOSAL_LIMITS))
        result = validate(self._sandboxes, parse_proposal(response, task_type), set())
        if result.rejection is not None:
            return Verdict(0.0, False, {"reason": result.rejection.reason, "detail": result.rejection.detail})
        return Verdict(1.0, True, {"reason": None, "task_type": task_type})

    def close(self) -> None:
        for sandbox in self._sandboxes or ():
            sandbox.close()


@register("challenge")
@dataclass
class ChallengeVerifier:
    """A SPICE challenger's response judged by the validity rules against its document (the problem's `answer`):
    1 when the challenge is valid, else 0 with the rule it broke (held-out evaluation of the challenger)."""

    name: str = "challenge"
    version: str = "1.1"  # 1.1: the answer must be a span of whole words the question asks for

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:

        document = problem.get("answer")
        if not document:
            return Verdict(0.0, None, {"reason": "the problem holds no document"})
        challenge = parse_challenge(response, Document("held-out", document))
        if isinstance(challenge, Rejection):
            return Verdict(0.0, False, {"reason": challenge.reason, "detail": challenge.detail})
        return Verdict(1.0, True, {"reason": None, "question": challenge.question, "answer": challenge.answer})


@register("learnability")
@dataclass
class LearnabilityVerifier:
    """The verifier named by self-play's proposer prompts. A proposer's reward is the learnability of its task,
    known only once the solver has tried it, so the self-play stage scores proposer rollouts itself; scoring
    them again apart from it is refused (not scored 0)."""

    name: str = "learnability"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        raise VerifierUnavailable(
            "proposer rollouts are scored by the self-play stage (the learnability of each "
            "task from the solver's solve rate): re-run the iteration, not its verification"
        )


@register("self_verify")
@dataclass
class SelfVerifyVerifier:
    """A policy's judgement of a solution (RISE): against the verdict, and the first wrong step where known
    (tasks/rise.py)."""

    name: str = "self_verify"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:

        try:
            reward, correct, details = judgement_reward(response, problem.get("answer") or "")
        except (ValueError, KeyError, TypeError):
            return Verdict(0.0, None, {"reason": "the problem holds no verification answer"})
        return Verdict(reward, correct, details)
