"""`rlvr reward serve`: the platform's verifiers over HTTP, every scored response recorded into the lake.

Two routes:
- `POST /get_reward` speaks OpenRLHF's remote reward protocol (`--reward.remote_url http://HOST:PORT/get_reward`,
  `openrlhf/utils/agent.py`): `{"query": [prompt + response], "prompts": [prompt], "labels": [label]}`, lists of
  equal length, possibly empty; the response is the query past the prompt (a query that does not hold its prompt
  is a 400), less its trailing end-of-sequence text; the answer is `{"rewards": [...], "scores": [...],
  "extra_logs": {"correct": [...]}}`. OpenRLHF sends no step and no model: they are the server's run and model,
  and the k-th rollout the lake stores for that run belongs to step `k // rollouts_per_step` (OpenRLHF's rollout
  batch size × samples per prompt; 0 puts all in step 0): counted at commit, so a refused or failed request takes
  no number, and a restarted server counts on from the rollouts stored.
- `POST /v1/rewards` (native): `{"run": name, "step": s, "model": id, "items": [{"prompt", "response", "label"
  and/or "problem_id", "domain"?, "verifier"?, "response_token_ids"?}]}` → `{"rewards", "correct", "verifiers",
  "iteration", "lake_run_id"}`; a run outside `allowed_runs` is a 403.
- `GET /health` → `{"status": "ok", "bank_problems": n}`.

The HTTP side (routes, the bearer token, the size limit) is `tasks/interop/reward_http.py`.

Concurrent requests are answered by one committer thread in group commits: whatever arrived within
`commit_interval` seconds (or `max_batch` responses) is scored in one pass over the verifier pool (code in the
sandbox, each item within `item_timeout`) and recorded as one stage run per trainer run; a request is answered
only once its rows are committed, so a crash loses no acknowledged reward. A run whose commit fails answers 500
to its own requests, and none of its rows becomes visible; the batch's other runs stand. What can be checked
before queueing (the run's name, a problem the bank lacks with no label, an iteration another run holds) is a
400 to the request that asked for it, never a failure of the others.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from os.path import commonprefix

import polars as pl

from storage.lake import Lake
from tasks.interop.bank_index import BankIndex
from tasks.interop.recording import NAME, Attempt, ExternalRun
from tasks.interop.rewards import score
from tasks.verification.stage import VerifyConfig, verifier_pool

# OpenRLHF decodes the query with its special tokens: the end-of-sequence text (`<|im_end|>`, `</s>`, ...) trails it
END_TOKENS = re.compile(r"(?:\s*(?:<\|[^|<>\s]{1,40}\|>|</s>|<eos>|<end_of_turn>))+\s*$")
# and versions that decode a padded batch (before `agent.py`) lead it with padding or a start-of-sequence token
SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>|<pad>|<eos>|<unk>|<bos>")


class BadRequest(ValueError):
    """A request the server cannot read (answered 400, naming the field)."""


class Forbidden(ValueError):
    """A request for a run this server may not write (answered 403)."""


def response_of(query: str, prompt: str, index: int = 0) -> str:
    """The response inside OpenRLHF's query (prompt + response, decoded with special tokens): what follows the
    prompt, which may be led only by special tokens (padding). A query that does not hold its prompt is refused:
    scoring all of it would score the prompt too, and an example answer in a prompt would then earn reward."""
    start = 0
    while not query.startswith(prompt, start):
        token = SPECIAL_TOKEN.match(query, start)
        if token is None:
            at = len(commonprefix([query, prompt]))
            raise BadRequest(
                f"query[{index}] does not start with prompts[{index}] (only special tokens such as "
                f"padding may lead it): they part at character {at}, where the query has "
                f"{query[at : at + 40]!r} and the prompt {prompt[at : at + 40]!r}. A prompt OpenRLHF "
                "cut to fit its length limit reads so (it logs 'Prompt length … exceeds "
                "max_prompt_length'): raise that limit"
            )
        start = token.end()
    return END_TOKENS.sub("", query[start + len(prompt) :])


@dataclass
class Item:
    run: str
    step: int | None  # None: OpenRLHF's, numbered when committed
    model: str
    prompt: str
    response: str
    label: str | None
    problem_id: str | None = None
    domain: str | None = None
    verifier: str | None = None
    response_token_ids: list[int] | None = None
    problem: dict | None = None  # the bank's row (or the label's), resolved before queueing


@dataclass
class Job:
    items: list[Item]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[dict] | None = None
    error: str | None = None
    run_ids: dict[str, str] = field(default_factory=dict)


class RewardService:
    """Scores and records the items of concurrent requests in group commits (see the module's docstring)."""

    def __init__(
        self,
        lake: Lake,
        run: str,
        model: str = "openrlhf",
        trainer: str = "openrlhf",
        config: VerifyConfig | None = None,
        rollouts_per_step: int = 0,
        iteration_offset: int = 0,
        commit_interval: float = 0.2,
        max_batch: int = 4096,
        allowed_runs: Iterable[str] | None = None,
    ):
        self.lake, self.run, self.model, self.trainer = lake, run, model, trainer
        # the runs the native route may write (None: any); the server's own run is always one of them
        allowed = None if allowed_runs is None else frozenset(allowed_runs)
        self.allowed_runs = None if allowed is None else allowed | {run}
        for name in sorted(allowed or ()):
            if not NAME.match(name):
                raise ValueError(f"--allow-run {name!r} is not a run name: letters, digits, '.', '_' and '-'")
        self.config = config or VerifyConfig(workers=0)
        self.rollouts_per_step, self.offset = rollouts_per_step, iteration_offset
        self.commit_interval, self.max_batch = commit_interval, max_batch
        self.bank = BankIndex.of(lake)
        self.runs: dict[str, ExternalRun] = {}
        self._pending: list[Job] = []
        self._lock = threading.Condition()
        self._runs_lock = threading.Lock()
        self._stored = 0  # the server's run's rollouts in the lake: OpenRLHF's steps
        self._queued = 0  # and those waiting for a commit
        self._stopping = False
        self._pool = None
        self._thread: threading.Thread | None = None
        self.commits = 0

    def start(self) -> RewardService:
        self._pool = verifier_pool(self.config).start()
        self._stored = self._external(self.run).stored_rollouts()  # a restarted server numbers its steps on
        self._thread = threading.Thread(target=self._commit_loop, name="reward-commits", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.close()

    # ---- requests ------------------------------------------------------------------------
    def openrlhf(self, body: dict) -> dict:
        queries, prompts, labels = (_strings(body, key) for key in ("query", "prompts", "labels"))
        if not len(queries) == len(prompts) == len(labels):
            raise BadRequest(
                f"query, prompts and labels must have one entry each per sample: got {len(queries)}, "
                f"{len(prompts)} and {len(labels)}"
            )
        if not queries:
            return {"rewards": [], "scores": [], "extra_logs": {}}
        responses = [response_of(query, prompt, i) for i, (query, prompt) in enumerate(zip(queries, prompts))]
        items = [
            Item(self.run, None, self.model, prompt, response, label)
            for prompt, response, label in zip(prompts, responses, labels)
        ]
        rows = self.submit(items).result
        rewards = [row["reward"] for row in rows]
        return {
            "rewards": rewards,
            "scores": rewards,
            "extra_logs": {"correct": [1.0 if row["correct"] else 0.0 for row in rows]},
        }

    def native(self, body: dict) -> dict:
        run = body.get("run", self.run)
        step, model = body.get("step"), body.get("model", self.model)
        if not isinstance(run, str) or not isinstance(model, str):
            raise BadRequest("`run` and `model` must be strings")
        if self.allowed_runs is not None and run not in self.allowed_runs:
            raise Forbidden(
                f"run {run!r} is not one this server may write: {', '.join(sorted(self.allowed_runs))} "
                "(its --run and --allow-run)"
            )
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise BadRequest(f"`step` must be an integer ≥ 0, got {step!r}")
        entries = body.get("items")
        if not isinstance(entries, list):
            raise BadRequest("`items` must be a list of {prompt, response, label and/or problem_id}")
        items = [_item(run, step, model, entry, i) for i, entry in enumerate(entries)]
        job = self.submit(items) if items else Job([], result=[])
        return {
            "rewards": [row["reward"] for row in job.result],
            "correct": [row["correct"] for row in job.result],
            "verifiers": [row["verifier"] for row in job.result],
            "iteration": self.offset + step,
            "lake_run_id": job.run_ids.get(run),
        }

    def submit(self, items: list[Item]) -> Job:
        """Check the items (a bad one is a 400 for its own request, never a failure of the whole group commit),
        queue them for the next group commit and wait until they are committed (or failed)."""
        job = Job(items)
        self._resolve(items)
        with self._lock:  # checked and queued as one: the steps it may land in stand
            self._check_owners(items)
            if self._stopping:
                raise RuntimeError("the reward server is stopping")
            self._pending.append(job)
            self._queued += sum(item.run == self.run for item in items)
            self._lock.notify_all()
        job.done.wait()
        if job.error is not None:
            raise RuntimeError(job.error)
        return job

    def _resolve(self, items: list[Item]) -> None:
        try:
            for item in items:
                item.problem = self.bank.resolve(item.prompt, item.label, item.problem_id, item.domain, item.verifier)
        except ValueError as error:
            raise BadRequest(str(error)) from None

    def _check_owners(self, items: list[Item]) -> None:
        """Refuse a step whose iteration another run holds: the items' own steps, and for OpenRLHF's every step
        the commit may number them into (the count stored, plus what is queued before them)."""
        steps = {(item.run, item.step) for item in items if item.step is not None}
        if any(item.step is None for item in items):
            last = self._stored + self._queued + len(items) - 1
            steps |= {(self.run, step) for step in range(self._step_of(self._stored), self._step_of(last) + 1)}
        try:
            with self._runs_lock:
                for run, step in sorted(steps):
                    recorder = self._external(run)
                    recorder.check_owner(recorder.iteration(step))
        except ValueError as error:
            raise BadRequest(str(error)) from None

    def _step_of(self, index: int) -> int:
        return index // self.rollouts_per_step if self.rollouts_per_step else 0

    def _number(self, items: list[Item]) -> None:
        """OpenRLHF's step of each of the server's run's items: the k-th rollout the lake stores for the run is in
        step k // rollouts_per_step, counted at commit, so a failed commit (whose retry comes again) or a refused
        request takes no number, and a restarted server counts on from the same place."""
        for position, item in enumerate(items):
            if item.step is None:
                item.step = self._step_of(self._stored + position)

    # ---- the committer -------------------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._stopping:
                    self._lock.wait()
                if not self._pending and self._stopping:
                    return
                deadline = time.monotonic() + self.commit_interval
                while (
                    sum(len(job.items) for job in self._pending) < self.max_batch
                    and not self._stopping
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._lock.wait(left)
                jobs, self._pending = self._pending, []
            self._commit(jobs)

    def _commit(self, jobs: list[Job]) -> None:
        """Score every job's items in one pass, then record each trainer run's jobs as its own stage run: a run
        that fails answers 500 to its own requests only (its rows stay invisible); the others stand."""
        items = [item for job in jobs for item in job.items]
        try:
            scored = score(
                [item.problem for item in items], [item.response for item in items], self.config, self._pool
            ).select("verifier", "verifier_version", "reward", "correct", "format_reward", "process_reward", "details")
        except Exception as error:  # noqa: BLE001 - every request learns why
            with self._lock:
                self._queued -= sum(item.run == self.run for item in items)
            self._answer(jobs, None, f"{type(error).__name__}: {error}")
            return
        starts, position = [], 0
        for job in jobs:
            starts.append(position)
            position += len(job.items)
        for run in sorted({job.items[0].run for job in jobs}):
            mine = [(job, start) for job, start in zip(jobs, starts) if job.items[0].run == run]
            rows = [start + k for job, start in mine for k in range(len(job.items))]
            if run == self.run:
                self._number([items[i] for i in rows])
            attempts = [
                Attempt(
                    items[i].step,
                    items[i].model,
                    items[i].prompt,
                    items[i].response,
                    items[i].problem["problem_id"],
                    items[i].response_token_ids,
                )
                for i in rows
            ]
            rewards = scored[rows].with_columns(rollout_id=pl.Series([str(k) for k in range(len(rows))]))
            try:
                run_id = self._external(run).record(attempts, rewards)
            except Exception as error:  # noqa: BLE001 - this run's requests learn why
                self._answer([job for job, _ in mine], None, f"{type(error).__name__}: {error}")
                continue
            finally:
                with self._lock:
                    self._queued -= len(rows) if run == self.run else 0
            if run == self.run:
                with self._lock:
                    self._stored += len(rows)
            self.commits += 1
            verdicts = rewards.select("reward", "correct", "verifier").to_dicts()
            offset = 0
            for job, _ in mine:
                job.run_ids = {run: run_id}
                self._answer([job], verdicts[offset : offset + len(job.items)], None)
                offset += len(job.items)

    @staticmethod
    def _answer(jobs: list[Job], rows: list[dict] | None, error: str | None) -> None:
        for job in jobs:
            job.result, job.error = rows, error
            job.done.set()

    def _external(self, run: str) -> ExternalRun:
        if run not in self.runs:  # a bad name raises ValueError: a 400 from `_check_owners`
            self.runs[run] = ExternalRun(self.lake, run, self.trainer if run == self.run else "native", self.offset)
        return self.runs[run]


def _strings(body: dict, key: str) -> list[str]:
    value = body.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"`{key}` must be a list of strings")
    return value


def _item(run: str, step: int, model: str, entry, index: int) -> Item:
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("prompt"), str)
        or not isinstance(entry.get("response"), str)
    ):
        raise BadRequest(f"items[{index}]: needs `prompt` and `response` strings")
    label, problem_id = entry.get("label"), entry.get("problem_id")
    if label is None and problem_id is None:
        raise BadRequest(f"items[{index}]: needs a `label` (ground truth) or the bank's `problem_id`")
    ids = entry.get("response_token_ids")
    if ids is not None and (
        not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise BadRequest(f"items[{index}]: `response_token_ids` must be a list of integers")
    return Item(
        run,
        step,
        model,
        entry["prompt"],
        entry["response"],
        None if label is None else str(label),
        problem_id,
        entry.get("domain"),
        entry.get("verifier"),
        ids,
    )
