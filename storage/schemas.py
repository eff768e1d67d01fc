"""The table contract: one explicit Arrow schema per lake table.

A table is replaced per key (its `slice_by` columns): re-running a stage for the same bank version or
iteration replaces exactly that slice. Later stages add their tables here.

Only the bank's tables are partitioned (by bank version: few, large slices). A table that gains a slice every
iteration or training step is not: partitioned, it would hold a file per slice for ever (maintenance cannot merge
files across partitions), and delta-rs pays for each file on every write and read, so a long run's bookkeeping
grew with its age (`rlvr bench lake-scale`, docs/guarantees.md "What a long run's lake costs"). Unpartitioned,
`rlvr lake maintain` compacts the slices into a few files, and reads of one slice prune on the files' statistics.
A lake written before keeps the partitioning its tables were made with (a write follows the table's own).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from deltalake import PostCommitHookProperties, WriterProperties

VERIFICATION_ROUND = 99    # the `round` of RISE's in-batch verification groups: after every resampling round

# Every Parquet file the lake writes (stage writes, the runs table, compaction): zstd, not delta-rs's default
# snappy. Measured on rollouts with token ids and behaviour log-probs (`rlvr bench lake-scale`, docs/guarantees.md
# "What a long run's lake costs"): smaller files, and no slower to write or read.
PARQUET_WRITER = WriterProperties(compression="ZSTD")
# After every lake commit: a checkpoint each 100 commits (delta-rs's default: a reader replays at most 100 commit
# files), but not delta-rs's default sweep of expired commit files, which lists the whole log at each commit
# to remove the files older than the log retention (30 days by default): nothing, in any loop younger than that,
# at a cost that grows with the log (about 8 ms of a commit's 25-33 ms at 900 commit files, on local disk; ten
# commits a loop step go to `runs`).
# `rlvr lake maintain` removes them, after its checkpoint and at its retention (storage/maintenance.py).
POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...]       # physical partitions of a table made new (an existing one keeps its own)
    description: str
    unique: tuple[str, ...] = ()        # columns no two visible rows may share (a write that would is refused)
    slice_by: tuple[str, ...] = ()      # the key a replace swaps out, when not the partition columns

    @property
    def replace_key(self) -> tuple[str, ...]:
        """The columns a replace's key must give: the slice one stage run owns."""
        return self.slice_by or self.partition_by


def column(name: str, type_: pa.DataType, nullable: bool = True, doc: str = "") -> pa.Field:
    """A column of the contract, its one-line description kept in the Parquet field's metadata."""
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc} if doc else None)


PROBLEMS = TableSpec(
    name="problems",
    partition_by=("bank_version",),
    unique=("problem_id",),             # the id hashes the split too: one row per problem and split
    description="The problem bank: one row per problem, added by the bank version that first curated it.",
    schema=pa.schema([
        column("problem_id", pa.string(), False, "content hash of domain, prompt, answer and tests"),
        column("bank_version", pa.int64(), False, "bank version that added the problem"),
        column("source", pa.string(), False, "source name, e.g. gsm8k-train or gen:linear_equation"),
        column("source_kind", pa.string(), False, "layout or generator family that read it"),
        column("source_uri", pa.string(), False, "file path or generator name"),
        column("source_line", pa.int64(), True, "1-based line (JSONL) or row (Parquet) in the source file"),
        column("split", pa.string(), False, "train or eval"),
        column("domain", pa.string(), False, "math, code, logic or qa"),
        column("level", pa.int8(), False, "difficulty level 1-4"),
        column("prompt", pa.string(), False, "the problem statement shown to the policy"),
        column("answer", pa.string(), True, "ground-truth final answer (math, logic, qa)"),
        column("solution", pa.string(), True, "reference worked solution or code"),
        column("steps", pa.list_(pa.string()), True, "step-level ground truth, e.g. GSM8K calculator steps a*b=c"),
        column("tests", pa.string(), True, "test source for code problems"),
        column("entry_point", pa.string(), True, "function under test for code problems"),
        column("verifier", pa.string(), False, "name of the verifier that scores responses"),
        column("seed", pa.int64(), True, "per-problem seed of a procedural source"),
        column("params", pa.string(), True, "JSON: generator parameters or column mapping"),
        column("metadata", pa.string(), True, "JSON: the source's other fields"),
        column("run_id", pa.string(), False, "run that wrote the row"),
    ]),
)

QUARANTINE = TableSpec(
    name="quarantine",
    partition_by=("bank_version",),
    description="Rows rejected by validation, with the file, line, field and reason.",
    schema=pa.schema([
        column("bank_version", pa.int64(), False),
        column("source", pa.string(), False),
        column("source_uri", pa.string(), False),
        column("source_line", pa.int64(), True),
        column("field", pa.string(), True, "the offending field, if one"),
        column("reason", pa.string(), False),
        column("raw", pa.string(), True, "the rejected row, truncated to 2,000 characters"),
        column("run_id", pa.string(), False),
    ]),
)

DROPPED = TableSpec(
    name="dropped_problems",
    partition_by=("bank_version",),
    description="Valid problems left out of the bank by deduplication or decontamination.",
    schema=pa.schema([
        column("bank_version", pa.int64(), False),
        column("problem_id", pa.string(), False),
        column("source", pa.string(), False),
        column("source_uri", pa.string(), False),
        column("source_line", pa.int64(), True),
        column("seed", pa.int64(), True),
        column("reason", pa.string(), False, "exact_duplicate, near_duplicate or contaminated"),
        column("duplicate_of", pa.string(), True, "problem id kept instead, or the evaluation set matched"),
        column("similarity", pa.float64(), True, "estimated Jaccard or n-gram overlap"),
        column("prompt", pa.string(), False),
        column("run_id", pa.string(), False),
    ]),
)

RUNS = TableSpec(
    name="runs",
    partition_by=(),
    description="The lineage spine: one row per stage run.",
    schema=pa.schema([
        column("run_id", pa.string(), False),
        column("flow", pa.string(), False),
        column("stage", pa.string(), False),
        column("bank_version", pa.int64(), True),
        column("iteration", pa.int64(), True),
        column("parameters", pa.string(), False, "JSON of the stage's config"),
        column("code_version", pa.string(), False, "git commit (+dirty) or package version"),
        column("prefect_flow_run_id", pa.string(), True),
        column("started_at", pa.timestamp("us", tz="UTC"), False),
        column("ended_at", pa.timestamp("us", tz="UTC"), True),
        column("status", pa.string(), False, "running, completed or failed"),
        column("error", pa.string(), True),
        column("table_versions", pa.string(), True, "JSON: Delta version each write of the run produced"),
        column("rows_written", pa.string(), True, "JSON: rows written per table"),
    ]),
)

ROLLOUTS = TableSpec(
    name="rollouts",
    partition_by=(),
    slice_by=("iteration",),
    description="Sampled responses: one row per (problem, sample) of an iteration's groups.",
    schema=pa.schema([
        column("rollout_id", pa.string(), False),
        column("iteration", pa.int64(), False),
        column("problem_id", pa.string(), False),
        column("group_id", pa.string(), False, "one group per (iteration, problem) draw"),
        column("sample_idx", pa.int32(), False),
        column("round", pa.int32(), True, "dynamic-sampling generation round that drew the group (1 = first)"),
        column("model_version", pa.int64(), False, "policy version that produced the response"),
        column("prompt", pa.string(), True, "the formatted prompt sent to the policy (template applied)"),
        column("prompt_token_ids", pa.list_(pa.int32()), True),
        column("response", pa.string(), False),
        column("response_token_ids", pa.list_(pa.int32()), True),
        column("behaviour_logprobs", pa.list_(pa.float32()), True, "log-probs of the sampled tokens under the sampler"),
        column("n_tokens", pa.int32(), True),
        column("finish_reason", pa.string(), True, "stop or length"),
        column("self_certainty", pa.float64(), True, "mean over response tokens of KL(uniform || next-token "
               "distribution); null where the backend gives no full distribution"),
        column("backend", pa.string(), True, "hf or openai (with the endpoint that answered)"),
        column("sampler", pa.string(), True, "JSON: the full sampler config"),
        column("seed", pa.int64(), True, "seed of the generation call that produced the group"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), True),
        column("loss_mask", pa.list_(pa.int8()), True, "episodes: 1 on the model's response tokens, 0 on the "
               "tool's (never in the policy loss); null: every token is the model's"),
        column("turns", pa.string(), True, "episodes, JSON: each segment's role (model or tool), text and tokens"),
        column("tool_calls", pa.int32(), True, "episodes: tool calls made"),
        column("tool_errors", pa.int32(), True, "episodes: tool calls that failed (an exception, a time-out)"),
    ]),
)

REWARDS = TableSpec(
    name="rewards",
    partition_by=(),
    slice_by=("iteration",),
    description="Verifier verdicts on rollouts; one row per (rollout, verifier, verifier version).",
    schema=pa.schema([
        column("iteration", pa.int64(), False),
        column("rollout_id", pa.string(), False),
        column("problem_id", pa.string(), False),
        column("verifier", pa.string(), False),
        column("verifier_version", pa.string(), False),
        column("reward", pa.float64(), False),
        column("correct", pa.bool_(), True, "null when the verifier cannot decide"),
        column("format_reward", pa.float64(), True, "answer given in the required form"),
        column("process_reward", pa.float64(), True, "step-level score, where the verifier computes one"),
        column("corrected_reward", pa.float64(), True, "(R - rho0) / (1 - rho0 - rho1) with the verifier's audited noise"),
        column("details", pa.string(), True, "JSON: extracted answer, failure reason, tests passed"),
        column("run_id", pa.string(), False),
        column("composed_reward", pa.float64(), True, "the reward training sees: the reward config's weighted sum "
               "of components (tasks/rewards/compose.py); on the rollout's own verifier's row"),
        column("reward_components", pa.string(), True, "JSON: each component's mapped value, null where absent"),
    ]),
)

VERIFIER_NOISE = TableSpec(
    name="verifier_noise",
    partition_by=(),
    description="Audited error rates of a verifier version: false positives rho0, false negatives rho1.",
    schema=pa.schema([
        column("verifier", pa.string(), False),
        column("verifier_version", pa.string(), False),
        column("rho0", pa.float64(), False, "P(judged correct | truly wrong)"),
        column("rho1", pa.float64(), False, "P(judged wrong | truly correct)"),
        column("n_correct", pa.int64(), False),
        column("n_wrong", pa.int64(), False),
        column("audit", pa.string(), False, "where the true labels came from"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
        column("rho0_low", pa.float64(), True, "95 % Wilson interval of rho0: low end"),
        column("rho0_high", pa.float64(), True, "95 % Wilson interval of rho0: high end"),
        column("rho1_low", pa.float64(), True, "95 % Wilson interval of rho1: low end"),
        column("rho1_high", pa.float64(), True, "95 % Wilson interval of rho1: high end"),
    ]),
)

GROUPS = TableSpec(
    name="groups",
    partition_by=(),
    slice_by=("iteration",),
    description="One row per sampled group: reward statistics, solve rate, and what dynamic sampling did with it.",
    schema=pa.schema([
        column("iteration", pa.int64(), False),
        column("group_id", pa.string(), False),
        column("problem_id", pa.string(), False),
        column("model_version", pa.int64(), True),
        column("round", pa.int32(), True, "dynamic-sampling generation round that drew it"),
        column("n_samples", pa.int64(), False),
        column("mean_reward", pa.float64(), True),
        column("std_reward", pa.float64(), True),
        column("min_reward", pa.float64(), True),
        column("max_reward", pa.float64(), True),
        column("solve_rate", pa.float64(), True),
        column("kept", pa.bool_(), False),
        column("filter_reason", pa.string(), True, "all_wrong, all_correct, outside_band, surplus, or null when kept"),
        column("run_id", pa.string(), False),
    ]),
)

ADVANTAGES = TableSpec(
    name="advantages",
    partition_by=(),
    slice_by=("iteration",),
    description="Per-rollout advantage with the estimator, the shaped reward and the freshness that produced it.",
    schema=pa.schema([
        column("iteration", pa.int64(), False),
        column("rollout_id", pa.string(), False),
        column("group_id", pa.string(), False),
        column("problem_id", pa.string(), False),
        column("estimator", pa.string(), False),
        column("reward", pa.float64(), False, "the verifier's reward"),
        column("shaped_reward", pa.float64(), False, "after overlong shaping; what the estimator used"),
        column("advantage", pa.float64(), False),
        column("loss_mask", pa.float64(), False, "0 excludes the rollout from the loss (masked truncation, stale)"),
        column("importance_weight", pa.float64(), True, "1 when fresh; truncated π_current/π_behaviour when "
               "acceptable; null when stale"),
        column("staleness", pa.int64(), False),
        column("freshness", pa.string(), False, "fresh, acceptable or stale"),
        column("run_id", pa.string(), False),
    ]),
)

BATCHES = TableSpec(
    name="batches",
    partition_by=(),
    slice_by=("iteration",),
    description="Exactly what a training step consumes: rollouts, their advantages and weights.",
    schema=pa.schema([
        column("batch_id", pa.string(), False),
        column("iteration", pa.int64(), False),
        column("rollout_id", pa.string(), False),
        column("group_id", pa.string(), False),
        column("advantage", pa.float64(), False),
        column("weight", pa.float64(), False, "loss mask times importance weight (1 for fresh rollouts)"),
        column("run_id", pa.string(), False),
    ]),
)

DBB_STATE = TableSpec(
    name="dbb_state",
    partition_by=(),
    slice_by=("iteration",),
    description="Discounted Beta-Bernoulli success state per problem after each iteration.",
    schema=pa.schema([
        column("iteration", pa.int64(), False, "the state holds after this iteration"),
        column("problem_id", pa.string(), False),
        column("dbb_alpha", pa.float64(), False),
        column("dbb_beta", pa.float64(), False),
        column("run_id", pa.string(), False),
    ]),
)

MODEL_VERSIONS = TableSpec(
    name="model_versions",
    partition_by=(),
    slice_by=("model_version",),
    description="The model registry: one row per policy version, with its parent and what produced it.",
    schema=pa.schema([
        column("model_version", pa.int64(), False),
        column("parent_version", pa.int64(), True, "null for a base model"),
        column("kind", pa.string(), False, "base, warmup or rl"),
        column("checkpoint_uri", pa.string(), False, "HF checkpoint folder (local or s3://) or an external path"),
        column("served_name", pa.string(), True, "model name an OpenAI-compatible server knows it by, if any"),
        column("iteration", pa.int64(), True, "training iteration that produced it"),
        column("batch_ids", pa.list_(pa.string()), True, "batches the training step consumed"),
        column("architecture", pa.string(), True, "JSON: model config (type, sizes, vocabulary)"),
        column("metrics", pa.string(), True, "JSON: training metrics"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
    ]),
)

TABLES: dict[str, TableSpec] = {spec.name: spec for spec in (PROBLEMS, QUARANTINE, DROPPED, RUNS, ROLLOUTS, REWARDS,
                                                              VERIFIER_NOISE, GROUPS, ADVANTAGES, BATCHES, DBB_STATE,
                                                              MODEL_VERSIONS)}


def register(spec: TableSpec) -> TableSpec:
    """Add a table to the contract (later stages call this from their own schema modules)."""
    TABLES[spec.name] = spec
    return spec


EVALUATIONS = register(TableSpec(
    name="evaluations",
    partition_by=(),
    slice_by=("model_version",),
    description="Held-out solve rate of a model version, per source and level (sampled responses).",
    schema=pa.schema([
        column("model_version", pa.int64(), False),
        column("iteration", pa.int64(), True, "the loop iteration after which it was measured"),
        column("split", pa.string(), False),
        column("bank_version", pa.int64(), True, "bank version the held-out problems were drawn from (pinned)"),
        column("source", pa.string(), False),
        column("level", pa.int8(), False),
        column("problems", pa.int64(), False),
        column("samples", pa.int64(), False),
        column("solved", pa.int64(), False),
        column("solve_rate", pa.float64(), False, "solved / samples"),
        column("sampler", pa.string(), False, "JSON: how the responses were sampled"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
        column("k", pa.int64(), True, "the k of pass_at_k"),
        column("pass_at_k", pa.float64(), True, "mean over problems of 1 - C(n-c, k) / C(n, k) (n samples, c correct)"),
        column("scoring", pa.string(), True, "own (each problem's own verifier) or the verifier that re-scored them"),
    ]),
))

EVAL_ROLLOUTS = register(TableSpec(
    name="eval_rollouts",
    partition_by=(),
    slice_by=("model_version",),
    description="Every held-out response an evaluation sampled, with its score: what lets an evaluation be "
                "re-scored with another verifier without sampling again, and pass@k be computed.",
    schema=pa.schema([
        column("model_version", pa.int64(), False),
        column("scoring", pa.string(), False, "own (each problem's own verifier) or the verifier that re-scored them"),
        column("response_id", pa.string(), False, "eval-v{version}-{problem_id}-s{sample}: the same across re-scores"),
        column("problem_id", pa.string(), False),
        column("source", pa.string(), True),
        column("level", pa.int8(), True),
        column("sample_idx", pa.int32(), False),
        column("response", pa.string(), False),
        column("n_tokens", pa.int32(), True),
        column("finish_reason", pa.string(), True, "stop or length"),
        column("verifier", pa.string(), False),
        column("verifier_version", pa.string(), False),
        column("reward", pa.float64(), False),
        column("correct", pa.bool_(), True),
        column("details", pa.string(), True, "JSON: the verdict's details"),
        column("sampler", pa.string(), True, "JSON: how the responses were sampled"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), True),
    ]),
))

ITERATION_METRICS = register(TableSpec(
    name="iteration_metrics",
    partition_by=(),
    slice_by=("iteration",),
    description="One row per loop iteration: sampling, filtering, training and evaluation at a glance.",
    schema=pa.schema([
        column("iteration", pa.int64(), False),
        column("model_version", pa.int64(), False, "version that sampled the iteration"),
        column("trained_version", pa.int64(), True, "version the iteration's training step registered"),
        column("rounds", pa.int64(), True),
        column("groups", pa.int64(), True),
        column("groups_kept", pa.int64(), True),
        column("filtered_share", pa.float64(), True),
        column("learning_zone_share", pa.float64(), True),
        column("mean_reward", pa.float64(), True),
        column("solve_rate_by_level", pa.string(), True, "JSON: training groups' solve rate per level"),
        column("mean_staleness", pa.float64(), True),
        column("loss", pa.float64(), True),
        column("clip_fraction", pa.float64(), True),
        column("entropy", pa.float64(), True),
        column("eval_solve_rate", pa.float64(), True, "held-out sampled solve rate of trained_version"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
        column("mean_self_certainty", pa.float64(), True, "INTUITOR's self-certainty, mean over the iteration's "
               "rollouts that have one"),
    ]),
))

CURRICULUM = register(TableSpec(
    name="curriculum",
    partition_by=(),
    slice_by=("iteration",),
    description="Each rebalancing of the level mix: the measured solve rate and the old and new weight per level.",
    schema=pa.schema([
        column("iteration", pa.int64(), False, "the mix applies from the next iteration on"),
        column("level", pa.int8(), False),
        column("solve_rate", pa.float64(), True, "training groups' mean solve rate over the measured iterations"),
        column("old_weight", pa.float64(), False),
        column("new_weight", pa.float64(), False),
        column("reason", pa.string(), False, "in_zone, too_easy, too_hard, between or unmeasured"),
        column("run_id", pa.string(), False),
    ]),
))

GYM_CURRICULUM = register(TableSpec(
    name="gym_curriculum",
    partition_by=(),
    slice_by=("iteration",),
    description="Each difficulty decision for a reasoning-gym source: its solve rate at its current curriculum "
                "step, the step before and after, and the bank version holding the new step's problems.",
    schema=pa.schema([
        column("iteration", pa.int64(), False, "the difficulty applies from the next iteration on"),
        column("source", pa.string(), False, "the gym source's name in problems, e.g. gym:chain_sum"),
        column("dataset", pa.string(), False, "the reasoning-gym dataset"),
        column("solve_rate", pa.float64(), True, "mean solve rate of the groups measured at old_step"),
        column("groups", pa.int64(), False, "training groups measured at old_step over the measured iterations"),
        column("old_step", pa.int64(), False, "curriculum step (every attribute at this level, capped) before"),
        column("new_step", pa.int64(), False, "curriculum step after; equal to old_step when it stays"),
        column("max_step", pa.int64(), False, "the dataset's hardest step"),
        column("reason", pa.string(), False, "too_easy, too_hard, too_easy_at_max, too_hard_at_min, in_zone, "
               "between, unmeasured or step_rejected"),
        column("old_params", pa.string(), False, "JSON: the dataset parameters at old_step"),
        column("new_params", pa.string(), False, "JSON: the dataset parameters at new_step"),
        column("bank_version", pa.int64(), True, "bank version that added the new step's problems (moves only)"),
        column("problems", pa.int64(), True, "problems that bank version kept for this source"),
        column("seed", pa.int64(), True, "seed the new step's problems were generated with"),
        column("run_id", pa.string(), False),
    ]),
))

PUBLICATIONS = register(TableSpec(
    name="publications",
    partition_by=(),
    description="Each time a model version was published to an inference server: loaded, already served or "
                "failed (with why), and which older versions the server unloaded. Appended, one commit a publish.",
    schema=pa.schema([
        column("model_version", pa.int64(), False),
        column("served_name", pa.string(), False, "the name the server serves it by (what rollout requests)"),
        column("endpoint", pa.string(), False, "the server's base URL"),
        column("path", pa.string(), False, "the folder the server was told to load (after path_map)"),
        column("action", pa.string(), False, "loaded, already_served or failed"),
        column("error", pa.string(), True, "why it failed: the server's answer or the connection error"),
        column("unloaded", pa.list_(pa.string()), True, "older versions the server unloaded (max_loras)"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
        column("method", pa.string(), True, "adapter (load_lora_adapter by name) or full (weights swapped in place "
               "through the worker extension)"),
        column("seconds", pa.float64(), True, "how long the load took, confirmation included (loads only)"),
    ]),
))

LOGPROB_CHECKS = register(TableSpec(
    name="logprob_checks",
    partition_by=(),
    description="The log-prob agreement gate: per endpoint and model version, how far the server's behaviour "
                "log-probs of a few sampled responses are from the trainer's recomputation. Appended by the loop "
                "on each version it publishes and by `rlvr policy check`.",
    schema=pa.schema([
        column("model_version", pa.int64(), False),
        column("served_name", pa.string(), False, "the name the server was asked for"),
        column("endpoint", pa.string(), False, "the server's base URL"),
        column("tokens", pa.int64(), False, "response tokens compared"),
        column("mean_abs_delta", pa.float64(), False, "mean over tokens of |server log p - trainer log p|"),
        column("max_abs_delta", pa.float64(), False, "largest |server log p - trainer log p| of one token"),
        column("ratio_min", pa.float64(), False, "smallest exp(trainer - server): the importance ratio before any update"),
        column("ratio_max", pa.float64(), False, "largest such ratio"),
        column("ratio_std", pa.float64(), False, "standard deviation of the ratios (0 when the two agree)"),
        column("prompt_tokens_match", pa.bool_(), False, "the server conditioned on the prompt ids the hf backend would"),
        column("tolerance", pa.float64(), False, "rollout.logprob_tolerance: the most mean_abs_delta may be"),
        column("passed", pa.bool_(), False, "mean_abs_delta within tolerance and the prompt tokens match"),
        column("causes", pa.list_(pa.string()), True, "likely causes, most specific first, when it failed"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
    ]),
))

PROPOSALS = register(TableSpec(
    name="proposals",
    partition_by=(),
    slice_by=("iteration",),
    unique=("proposal_id",),
    description="Every task a model proposed (self-play, tasks/selfplay): who proposed it, what the executor "
                "said of it, the problem a valid one became, and the solver's solve rate once solved.",
    schema=pa.schema([
        column("proposal_id", pa.string(), False, "the proposer rollout's id with a p- prefix"),
        column("iteration", pa.int64(), False),
        column("role", pa.string(), False, "proposer (Absolute Zero) or challenger (SPICE)"),
        column("task_type", pa.string(), False, "deduction, abduction or induction"),
        column("model_version", pa.int64(), False, "the proposer's model version"),
        column("rollout_id", pa.string(), False, "the proposer rollout that wrote it"),
        column("document_id", pa.string(), True, "the source document of a grounded task (SPICE)"),
        column("span", pa.string(), True, "the document span the task cites (SPICE)"),
        column("verdict", pa.string(), False, "valid or invalid"),
        column("reason", pa.string(), True, "why invalid: unparseable, does_not_run, not_deterministic, "
               "forbidden_import, too_slow, output_too_large, not_a_literal, duplicate"),
        column("detail", pa.string(), True, "the executor's message"),
        column("task_key", pa.string(), True, "hash of the program's syntax tree and inputs: equal for duplicates"),
        column("shape_key", pa.string(), True, "hash of the syntax tree with constants abstracted: equal for "
               "near-duplicates"),
        column("program", pa.string(), True),
        column("inputs", pa.string(), True, "JSON: each call's argument tuple"),
        column("outputs", pa.string(), True, "JSON: each call's output, from the sandbox"),
        column("problem_id", pa.string(), True, "the problem a valid proposal became"),
        column("solve_rate", pa.float64(), True, "the solver's solve rate on it this iteration"),
        column("reward", pa.float64(), True, "the proposer's reward: learnability, or the invalid reward"),
        column("run_id", pa.string(), False),
        column("created_at", pa.timestamp("us", tz="UTC"), False),
        column("document_source", pa.string(), True, "the corpus file the document came from (SPICE)"),
        column("document_licence", pa.string(), True, "the document's licence as its corpus states it (SPICE)"),
    ]),
))
