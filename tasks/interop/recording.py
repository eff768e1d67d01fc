"""What a trainer's reward calls scored, written into the lake under the trainer's own run.

A run the platform did not drive is recorded like one it did: each response a `rollouts` row and its verdict a
`rewards` row, the step as the iteration, each group's solve rate in `groups`, and the policy that sampled the
step registered as an `external` model version (one per model and step, each the parent of the next), so
`rlvr sql`, the views, `rlvr analyze sampling`, re-scoring with `rlvr stage verify` and `rlvr lineage` read it.

- The run's stage runs are named by its flow, `external:<name>`: `select * from runs where flow = 'external:x'`.
- Each `record` call is one completed stage run (a few commits): its rows are visible, and durable, when it
  returns, which is when a caller acknowledges the rewards. Callers batch many responses into one call.
- An iteration belongs to one run: rows of another run there are refused (give the run an iteration offset).
- The platform's own loop takes the newest registered version for its policy, so a lake whose registry holds the
  platform's versions is refused: external runs are recorded into a lake of their own (with the bank, for
  re-scoring and lineage).
- One writer per run: two processes recording the same run's iterations would race on its `groups` rows (a
  recorder keeps the groups it committed and recomputes only those a commit adds responses to).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from storage.errors import LakeError
from storage.lake import Lake
from storage.registry import next_version_number, register
from storage.runs import Run, utc_now
from tasks.interop.external_groups import IterationGroups, group_stats, scored

EXTERNAL = "external"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
KEPT_ITERATIONS = 4  # the iterations a recorder keeps the groups of


@dataclass(frozen=True)
class Attempt:
    """One response a trainer sampled, as its reward call saw it."""

    step: int  # the trainer's step: the lake's iteration, past the offset
    model: str  # the trainer's name for the policy that sampled it
    prompt: str
    response: str
    problem_id: str  # the bank's id, or `ext-…` for a problem the bank lacks
    response_token_ids: list[int] | None = None


def external_problem_id(prompt: str, label: str) -> str:
    """A stable id for a (prompt, label) the bank does not hold."""
    return "ext-" + hashlib.sha256(f"{prompt}\x00{label}".encode()).hexdigest()[:16]


def group_id(run_name: str, iteration: int, problem_id: str) -> str:
    return hashlib.sha256(f"{run_name}\x00{iteration}\x00{problem_id}".encode()).hexdigest()[:16]


class ExternalRun:
    """A trainer's run recorded into `lake` as `external:<name>`; `trainer` is trl, openrlhf, verl or another
    name, and the trainer's step s is the lake's iteration `iteration_offset + s`."""

    def __init__(self, lake: Lake, name: str, trainer: str, iteration_offset: int = 0):
        if not NAME.match(name):
            raise ValueError(f"run name {name!r}: letters, digits, '.', '_' and '-', up to 128 characters")
        if iteration_offset < 0:
            raise ValueError(f"iteration offset {iteration_offset} must be 0 or more")
        self.lake, self.name, self.trainer, self.offset = lake, name, trainer, iteration_offset
        self.flow = f"{EXTERNAL}:{name}"
        self._versions: dict[tuple[str, int], int] = {}
        self._owned: set[int] = set()
        self._next_sample: dict[tuple[int, str], int] = {}
        # the groups of the iterations this recorder wrote last, as it committed them (a run has one writer)
        self._kept: OrderedDict[int, IterationGroups] = OrderedDict()

    def iteration(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"step {step} must be 0 or more")
        return self.offset + step

    def record(
        self,
        attempts: list[Attempt],
        rewards: pl.DataFrame,
        parameters: dict | None = None,
        advantages: list[float] | None = None,
    ) -> str:
        """Write the attempts and their reward rows as one completed stage run; returns its run id.

        `rewards` holds one or more rows per attempt (one per verifier), each naming its attempt by position as
        `rollout_id` "0", "1", … (as `rewards.score` returns them); `advantages`, where the trainer logged them,
        one per attempt. `parameters` join the stage run's record (an imported file's name and hash)."""
        if not attempts:
            return ""
        index = rewards["rollout_id"].cast(pl.Int64, strict=False)
        if index.is_null().any() or index.min() < 0 or index.max() >= len(attempts):
            raise ValueError(f"reward rows must name their attempt by position 0-{len(attempts) - 1}")
        unscored = sorted(set(range(len(attempts))) - set(index.to_list()))
        if unscored:
            raise ValueError(f"{len(unscored)} response(s) have no reward row (e.g. number {unscored[0]})")
        caches = (dict(self._versions), set(self._owned), dict(self._next_sample), OrderedDict(self._kept))
        try:
            return self._record(attempts, rewards, index, parameters, advantages)
        except BaseException:  # the run failed and its rows are hidden: forget what it made
            self._versions, self._owned, self._next_sample, self._kept = caches
            raise

    def _record(
        self,
        attempts: list[Attempt],
        rewards: pl.DataFrame,
        index: pl.Series,
        parameters: dict | None,
        advantages: list[float] | None,
    ) -> str:
        iterations = sorted({self.iteration(a.step) for a in attempts})
        parameters = {
            "trainer": self.trainer,
            "run": self.name,
            "iterations": iterations,
            "models": sorted({a.model for a in attempts}),
            "rollouts": len(attempts),
            **(parameters or {}),
        }
        with self.lake.run(self.flow, "reward", parameters, iteration=iterations[0]) as run:
            for iteration in iterations:
                self.check_owner(iteration)
            versions = {
                key: self._model_version(*key, run)
                for key in sorted({(a.model, self.iteration(a.step)) for a in attempts})
            }
            rollouts = self._rollout_rows(attempts, versions)
            self.lake.append("rollouts", rollouts, run)
            of = rollouts[index.to_list()]
            self.lake.append(
                "rewards",
                rewards.with_columns(
                    rollout_id=of["rollout_id"], iteration=of["iteration"], problem_id=of["problem_id"]
                ),
                run,
            )
            if advantages is not None:
                self.lake.append("advantages", self._advantage_rows(rollouts, rewards, index, advantages), run)
            before = self.lake.table("groups").version() if self.lake.exists("groups") else None
            added = scored(
                rollouts.with_columns(run_id=pl.lit(run.run_id)),
                rewards.with_columns(rollout_id=of["rollout_id"], run_id=pl.lit(run.run_id)),
            )
            try:
                for iteration in iterations:
                    ids = rollouts.filter(pl.col("iteration") == iteration)["rollout_id"]
                    groups = self._updated_groups(iteration, added.filter(pl.col("rollout_id").is_in(ids)))
                    self.lake.replace("groups", groups, {"iteration": iteration}, run)
            except BaseException:  # the earlier runs' groups put back, as they were
                for iteration in iterations:
                    self.lake.restore("groups", {"iteration": iteration}, before, run)
                raise
        return run.run_id

    def _advantage_rows(
        self, rollouts: pl.DataFrame, rewards: pl.DataFrame, index: pl.Series, advantages: list[float]
    ) -> pl.DataFrame:
        """The trainer's own advantages (its estimator, named after it), on the summed reward it trained on."""
        total = rewards.with_columns(attempt=index).group_by("attempt").agg(pl.col("reward").sum()).sort("attempt")
        return rollouts.select("iteration", "rollout_id", "group_id", "problem_id").with_columns(
            estimator=pl.lit(self.trainer),
            reward=total["reward"],
            shaped_reward=total["reward"],
            advantage=pl.Series(advantages, dtype=pl.Float64),
            loss_mask=pl.lit(1.0),
            staleness=pl.lit(0, pl.Int64),
            freshness=pl.lit("fresh"),
        )

    def _rollout_rows(self, attempts: list[Attempt], versions: dict[tuple[str, int], int]) -> pl.DataFrame:
        rows = []
        now = utc_now()
        for attempt in attempts:
            iteration = self.iteration(attempt.step)
            key = (iteration, attempt.problem_id)
            if key not in self._next_sample:
                self._next_sample[key] = self._samples_stored(*key)
            sample = self._next_sample[key]
            self._next_sample[key] = sample + 1
            ids = attempt.response_token_ids
            rows.append(
                {
                    "rollout_id": f"{self.name}-{iteration}-{group_id(self.name, iteration, attempt.problem_id)}-{sample}",
                    "iteration": iteration,
                    "problem_id": attempt.problem_id,
                    "group_id": group_id(self.name, iteration, attempt.problem_id),
                    "sample_idx": sample,
                    "model_version": versions[(attempt.model, iteration)],
                    "prompt": attempt.prompt,
                    "response": attempt.response,
                    "response_token_ids": ids,
                    "n_tokens": len(ids) if ids else None,
                    "backend": self.trainer,
                    "created_at": now,
                }
            )
        return pl.DataFrame(
            rows,
            schema_overrides={"response_token_ids": pl.List(pl.Int32), "n_tokens": pl.Int32, "sample_idx": pl.Int32},
        )

    def _samples_stored(self, iteration: int, problem_id: str) -> int:
        """The next sample number of this problem in this iteration (a restarted recorder numbers on past every
        row, a failed run's hidden ones included: rollout ids are never reused)."""
        stored = self.lake.read(
            "rollouts",
            filter=(pc.field("iteration") == iteration) & (pc.field("problem_id") == problem_id),
            columns=["sample_idx"],
            raw=True,
        )
        return 0 if stored.is_empty() else int(stored["sample_idx"].max()) + 1

    def run_ids(self) -> pa.Array:
        """The stage runs of this run's flow `external:NAME`: what its rows in every table are tagged with."""
        if not self.lake.exists("runs"):
            return pa.array([], pa.string())
        return pa.array(
            self.lake.read("runs", filter=pc.field("flow") == self.flow, columns=["run_id"])["run_id"].to_list(),
            pa.string(),
        )

    def stored_rollouts(self) -> int:
        """The run's responses in the lake (where a restarted OpenRLHF server numbers its steps on from)."""
        if not self.lake.exists("rollouts"):
            return 0
        return self.lake.read("rollouts", filter=pc.field("run_id").isin(self.run_ids()), columns=["rollout_id"]).height

    def _updated_groups(self, iteration: int, added: pl.DataFrame) -> pl.DataFrame:
        """The iteration's `groups` rows once a commit's scored responses are `added`: only their groups
        recomputed (`tasks/interop/external_groups.py`). A recorder's first commit to an iteration (a fresh step,
        or one a restarted server writes on) reads the iteration's stored responses."""
        kept = self._kept.pop(iteration, None)
        updated = IterationGroups.of(self._scored(iteration), iteration) if kept is None else kept.add(added)
        self._kept[iteration] = updated
        while len(self._kept) > KEPT_ITERATIONS:  # a trainer writes a step or two at a time
            self._kept.popitem(last=False)
        return updated.groups

    def _groups(self, iteration: int) -> pl.DataFrame:
        """The iteration's groups recomputed from every response stored there."""
        return group_stats(self._scored(iteration), iteration)

    def _scored(self, iteration: int) -> pl.DataFrame:
        """Every response stored in the iteration with the reward its trainer was given (`external_groups.scored`)."""
        where = pc.field("iteration") == iteration
        return scored(
            self.lake.read(
                "rollouts", filter=where, columns=["rollout_id", "group_id", "problem_id", "model_version", "run_id"]
            ),
            self.lake.read("rewards", filter=where, columns=["rollout_id", "reward", "correct", "run_id"]),
        )

    def check_owner(self, iteration: int) -> None:
        if iteration in self._owned:
            return
        writers = (
            self.lake.read("rollouts", filter=pc.field("iteration") == iteration, columns=["run_id"])["run_id"]
            .unique()
            .to_list()
        )
        if writers:
            flows = set(self.lake.read("runs", filter=pc.field("run_id").isin(writers), columns=["flow"])["flow"])
            others = sorted(flows - {self.flow})
            if others:
                raise ValueError(
                    f"iteration {iteration} of {self.lake.uri} holds rollouts of {', '.join(others)}: "
                    f"record run {self.name!r} past them (an iteration offset) or into a lake of its own"
                )
        self._owned.add(iteration)

    def _model_version(self, model: str, iteration: int, run: Run) -> int:
        """The external version of `model` at this iteration: registered on first sight, its parent the same
        model's version at the run's latest earlier iteration."""
        if (model, iteration) in self._versions:
            return self._versions[(model, iteration)]
        registered = self.lake.read("model_versions")
        own = registered.filter(
            (pl.col("kind") == EXTERNAL)
            & (pl.col("served_name") == model)
            & pl.col("metrics").str.contains(f'"run": "{self.name}"', literal=True)
        )
        found = own.filter(pl.col("iteration") == iteration)
        if found.height:
            self._versions[(model, iteration)] = int(found["model_version"].min())
            return self._versions[(model, iteration)]
        platform = registered.filter(pl.col("kind") != EXTERNAL)
        if platform.height:
            raise ValueError(
                f"{self.lake.uri} holds the platform's own policy versions "
                f"({', '.join(map(str, sorted(platform['model_version'])))}): its loop samples from the "
                "newest version, so an external model is not registered beside them; record external "
                "runs into a lake of their own (curate the bank there too)"
            )
        earlier = own.filter(pl.col("iteration") < iteration).sort("iteration")
        parent = int(earlier["model_version"][-1]) if earlier.height else None
        for _ in range(10):  # another writer may take the number first
            version = next_version_number(self.lake)
            try:
                register(
                    self.lake,
                    run,
                    version,
                    uri=model,
                    kind=EXTERNAL,
                    parent=parent,
                    iteration=iteration,
                    served_name=model,
                    metrics={"trainer": self.trainer, "run": self.name},
                )
                break
            except LakeError as error:
                if "already taken" not in str(error):
                    raise
        else:
            raise LakeError(
                f"could not register a version for {model} at iteration {iteration}: numbers kept "
                "being taken by other writers"
            )
        self._versions[(model, iteration)] = version
        return version
