"""The table contract: one explicit Arrow schema per lake table.

A table is replaced per key (its `partition_by` columns): re-running a stage for the same bank
version or iteration replaces exactly that slice. Later stages add their tables here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from deltalake import WriterProperties

# Every Parquet file the lake writes (stage writes, the runs table, compaction): zstd, not delta-rs's default
# snappy. Measured on rollouts with token ids and behaviour log-probs (`rlvr bench lake-scale`, docs/guarantees.md
# "What a long run's lake costs"): smaller files, and no slower to write or read.
PARQUET_WRITER = WriterProperties(compression="ZSTD")


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    description: str
    unique: tuple[str, ...] = ()        # columns no two visible rows may share (a write that would is refused)


def _field(name: str, type_: pa.DataType, nullable: bool = True, doc: str = "") -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc} if doc else None)


PROBLEMS = TableSpec(
    name="problems",
    partition_by=("bank_version",),
    unique=("problem_id",),             # the id hashes the split too: one row per problem and split
    description="The problem bank: one row per problem, added by the bank version that first curated it.",
    schema=pa.schema([
        _field("problem_id", pa.string(), False, "content hash of domain, prompt, answer and tests"),
        _field("bank_version", pa.int64(), False, "bank version that added the problem"),
        _field("source", pa.string(), False, "source name, e.g. gsm8k-train or gen:linear_equation"),
        _field("source_kind", pa.string(), False, "layout or generator family that read it"),
        _field("source_uri", pa.string(), False, "file path or generator name"),
        _field("source_line", pa.int64(), True, "1-based line (JSONL) or row (Parquet) in the source file"),
        _field("split", pa.string(), False, "train or eval"),
        _field("domain", pa.string(), False, "math, code, logic or qa"),
        _field("level", pa.int8(), False, "difficulty level 1-4"),
        _field("prompt", pa.string(), False, "the problem statement shown to the policy"),
        _field("answer", pa.string(), True, "ground-truth final answer (math, logic, qa)"),
        _field("solution", pa.string(), True, "reference worked solution or code"),
        _field("steps", pa.list_(pa.string()), True, "step-level ground truth, e.g. GSM8K calculator steps a*b=c"),
        _field("tests", pa.string(), True, "test source for code problems"),
        _field("entry_point", pa.string(), True, "function under test for code problems"),
        _field("verifier", pa.string(), False, "name of the verifier that scores responses"),
        _field("seed", pa.int64(), True, "per-problem seed of a procedural source"),
        _field("params", pa.string(), True, "JSON: generator parameters or column mapping"),
        _field("metadata", pa.string(), True, "JSON: the source's other fields"),
        _field("run_id", pa.string(), False, "run that wrote the row"),
    ]),
)

QUARANTINE = TableSpec(
    name="quarantine",
    partition_by=("bank_version",),
    description="Rows rejected by validation, with the file, line, field and reason.",
    schema=pa.schema([
        _field("bank_version", pa.int64(), False),
        _field("source", pa.string(), False),
        _field("source_uri", pa.string(), False),
        _field("source_line", pa.int64(), True),
        _field("field", pa.string(), True, "the offending field, if one"),
        _field("reason", pa.string(), False),
        _field("raw", pa.string(), True, "the rejected row, truncated to 2,000 characters"),
        _field("run_id", pa.string(), False),
    ]),
)

DROPPED = TableSpec(
    name="dropped_problems",
    partition_by=("bank_version",),
    description="Valid problems left out of the bank by deduplication or decontamination.",
    schema=pa.schema([
        _field("bank_version", pa.int64(), False),
        _field("problem_id", pa.string(), False),
        _field("source", pa.string(), False),
        _field("source_uri", pa.string(), False),
        _field("source_line", pa.int64(), True),
        _field("seed", pa.int64(), True),
        _field("reason", pa.string(), False, "exact_duplicate, near_duplicate or contaminated"),
        _field("duplicate_of", pa.string(), True, "problem id kept instead, or the evaluation set matched"),
        _field("similarity", pa.float64(), True, "estimated Jaccard or n-gram overlap"),
        _field("prompt", pa.string(), False),
        _field("run_id", pa.string(), False),
    ]),
)

RUNS = TableSpec(
    name="runs",
    partition_by=(),
    description="The lineage spine: one row per stage run.",
    schema=pa.schema([
        _field("run_id", pa.string(), False),
        _field("flow", pa.string(), False),
        _field("stage", pa.string(), False),
        _field("bank_version", pa.int64(), True),
        _field("iteration", pa.int64(), True),
        _field("parameters", pa.string(), False, "JSON of the stage's config"),
        _field("code_version", pa.string(), False, "git commit (+dirty) or package version"),
        _field("prefect_flow_run_id", pa.string(), True),
        _field("started_at", pa.timestamp("us", tz="UTC"), False),
        _field("ended_at", pa.timestamp("us", tz="UTC"), True),
        _field("status", pa.string(), False, "running, completed or failed"),
        _field("error", pa.string(), True),
        _field("table_versions", pa.string(), True, "JSON: Delta version each write of the run produced"),
        _field("rows_written", pa.string(), True, "JSON: rows written per table"),
    ]),
)

ROLLOUTS = TableSpec(
    name="rollouts",
    partition_by=("iteration",),
    description="Sampled responses: one row per (problem, sample) of an iteration's groups.",
    schema=pa.schema([
        _field("rollout_id", pa.string(), False),
        _field("iteration", pa.int64(), False),
        _field("problem_id", pa.string(), False),
        _field("group_id", pa.string(), False, "one group per (iteration, problem) draw"),
        _field("sample_idx", pa.int32(), False),
        _field("round", pa.int32(), True, "dynamic-sampling generation round that drew the group (1 = first)"),
        _field("model_version", pa.int64(), False, "policy version that produced the response"),
        _field("prompt", pa.string(), True, "the formatted prompt sent to the policy (template applied)"),
        _field("prompt_token_ids", pa.list_(pa.int32()), True),
        _field("response", pa.string(), False),
        _field("response_token_ids", pa.list_(pa.int32()), True),
        _field("behaviour_logprobs", pa.list_(pa.float32()), True, "log-probs of the sampled tokens under the sampler"),
        _field("n_tokens", pa.int32(), True),
        _field("finish_reason", pa.string(), True, "stop or length"),
        _field("self_certainty", pa.float64(), True, "mean over response tokens of KL(uniform || next-token "
               "distribution); null where the backend gives no full distribution"),
        _field("backend", pa.string(), True, "hf or openai (with the endpoint that answered)"),
        _field("sampler", pa.string(), True, "JSON: the full sampler config"),
        _field("seed", pa.int64(), True, "seed of the generation call that produced the group"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), True),
        _field("loss_mask", pa.list_(pa.int8()), True, "episodes: 1 on the model's response tokens, 0 on the "
               "tool's (never in the policy loss); null: every token is the model's"),
        _field("turns", pa.string(), True, "episodes, JSON: each segment's role (model or tool), text and tokens"),
        _field("tool_calls", pa.int32(), True, "episodes: tool calls made"),
        _field("tool_errors", pa.int32(), True, "episodes: tool calls that failed (an exception, a time-out)"),
    ]),
)

REWARDS = TableSpec(
    name="rewards",
    partition_by=("iteration",),
    description="Verifier verdicts on rollouts; one row per (rollout, verifier, verifier version).",
    schema=pa.schema([
        _field("iteration", pa.int64(), False),
        _field("rollout_id", pa.string(), False),
        _field("problem_id", pa.string(), False),
        _field("verifier", pa.string(), False),
        _field("verifier_version", pa.string(), False),
        _field("reward", pa.float64(), False),
        _field("correct", pa.bool_(), True, "null when the verifier cannot decide"),
        _field("format_reward", pa.float64(), True, "answer given in the required form"),
        _field("process_reward", pa.float64(), True, "step-level score, where the verifier computes one"),
        _field("corrected_reward", pa.float64(), True, "(R - rho0) / (1 - rho0 - rho1) with the verifier's audited noise"),
        _field("details", pa.string(), True, "JSON: extracted answer, failure reason, tests passed"),
        _field("run_id", pa.string(), False),
        _field("composed_reward", pa.float64(), True, "the reward training sees: the reward config's weighted sum "
               "of components (tasks/rewards/compose.py); on the rollout's own verifier's row"),
        _field("reward_components", pa.string(), True, "JSON: each component's mapped value, null where absent"),
    ]),
)

VERIFIER_NOISE = TableSpec(
    name="verifier_noise",
    partition_by=(),
    description="Audited error rates of a verifier version: false positives rho0, false negatives rho1.",
    schema=pa.schema([
        _field("verifier", pa.string(), False),
        _field("verifier_version", pa.string(), False),
        _field("rho0", pa.float64(), False, "P(judged correct | truly wrong)"),
        _field("rho1", pa.float64(), False, "P(judged wrong | truly correct)"),
        _field("n_correct", pa.int64(), False),
        _field("n_wrong", pa.int64(), False),
        _field("audit", pa.string(), False, "where the true labels came from"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
        _field("rho0_low", pa.float64(), True, "95 % Wilson interval of rho0: low end"),
        _field("rho0_high", pa.float64(), True, "95 % Wilson interval of rho0: high end"),
        _field("rho1_low", pa.float64(), True, "95 % Wilson interval of rho1: low end"),
        _field("rho1_high", pa.float64(), True, "95 % Wilson interval of rho1: high end"),
    ]),
)

GROUPS = TableSpec(
    name="groups",
    partition_by=("iteration",),
    description="One row per sampled group: reward statistics, solve rate, and what dynamic sampling did with it.",
    schema=pa.schema([
        _field("iteration", pa.int64(), False),
        _field("group_id", pa.string(), False),
        _field("problem_id", pa.string(), False),
        _field("model_version", pa.int64(), True),
        _field("round", pa.int32(), True, "dynamic-sampling generation round that drew it"),
        _field("n_samples", pa.int64(), False),
        _field("mean_reward", pa.float64(), True),
        _field("std_reward", pa.float64(), True),
        _field("min_reward", pa.float64(), True),
        _field("max_reward", pa.float64(), True),
        _field("solve_rate", pa.float64(), True),
        _field("kept", pa.bool_(), False),
        _field("filter_reason", pa.string(), True, "all_wrong, all_correct, outside_band, surplus, or null when kept"),
        _field("run_id", pa.string(), False),
    ]),
)

ADVANTAGES = TableSpec(
    name="advantages",
    partition_by=("iteration",),
    description="Per-rollout advantage with the estimator, the shaped reward and the freshness that produced it.",
    schema=pa.schema([
        _field("iteration", pa.int64(), False),
        _field("rollout_id", pa.string(), False),
        _field("group_id", pa.string(), False),
        _field("problem_id", pa.string(), False),
        _field("estimator", pa.string(), False),
        _field("reward", pa.float64(), False, "the verifier's reward"),
        _field("shaped_reward", pa.float64(), False, "after overlong shaping; what the estimator used"),
        _field("advantage", pa.float64(), False),
        _field("loss_mask", pa.float64(), False, "0 excludes the rollout from the loss (masked truncation, stale)"),
        _field("importance_weight", pa.float64(), True, "1 when fresh; truncated π_current/π_behaviour when "
               "acceptable; null when stale"),
        _field("staleness", pa.int64(), False),
        _field("freshness", pa.string(), False, "fresh, acceptable or stale"),
        _field("run_id", pa.string(), False),
    ]),
)

BATCHES = TableSpec(
    name="batches",
    partition_by=("iteration",),
    description="Exactly what a training step consumes: rollouts, their advantages and weights.",
    schema=pa.schema([
        _field("batch_id", pa.string(), False),
        _field("iteration", pa.int64(), False),
        _field("rollout_id", pa.string(), False),
        _field("group_id", pa.string(), False),
        _field("advantage", pa.float64(), False),
        _field("weight", pa.float64(), False, "loss mask times importance weight (1 for fresh rollouts)"),
        _field("run_id", pa.string(), False),
    ]),
)

DBB_STATE = TableSpec(
    name="dbb_state",
    partition_by=("iteration",),
    description="Discounted Beta-Bernoulli success state per problem after each iteration.",
    schema=pa.schema([
        _field("iteration", pa.int64(), False, "the state holds after this iteration"),
        _field("problem_id", pa.string(), False),
        _field("dbb_alpha", pa.float64(), False),
        _field("dbb_beta", pa.float64(), False),
        _field("run_id", pa.string(), False),
    ]),
)

MODEL_VERSIONS = TableSpec(
    name="model_versions",
    partition_by=("model_version",),
    description="The model registry: one row per policy version, with its parent and what produced it.",
    schema=pa.schema([
        _field("model_version", pa.int64(), False),
        _field("parent_version", pa.int64(), True, "null for a base model"),
        _field("kind", pa.string(), False, "base, warmup or rl"),
        _field("checkpoint_uri", pa.string(), False, "HF checkpoint folder (local or s3://) or an external path"),
        _field("served_name", pa.string(), True, "model name an OpenAI-compatible server knows it by, if any"),
        _field("iteration", pa.int64(), True, "training iteration that produced it"),
        _field("batch_ids", pa.list_(pa.string()), True, "batches the training step consumed"),
        _field("architecture", pa.string(), True, "JSON: model config (type, sizes, vocabulary)"),
        _field("metrics", pa.string(), True, "JSON: training metrics"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
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
    partition_by=("model_version",),
    description="Held-out solve rate of a model version, per source and level (sampled responses).",
    schema=pa.schema([
        _field("model_version", pa.int64(), False),
        _field("iteration", pa.int64(), True, "the loop iteration after which it was measured"),
        _field("split", pa.string(), False),
        _field("bank_version", pa.int64(), True, "bank version the held-out problems were drawn from (pinned)"),
        _field("source", pa.string(), False),
        _field("level", pa.int8(), False),
        _field("problems", pa.int64(), False),
        _field("samples", pa.int64(), False),
        _field("solved", pa.int64(), False),
        _field("solve_rate", pa.float64(), False, "solved / samples"),
        _field("sampler", pa.string(), False, "JSON: how the responses were sampled"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
        _field("k", pa.int64(), True, "the k of pass_at_k"),
        _field("pass_at_k", pa.float64(), True, "mean over problems of 1 - C(n-c, k) / C(n, k) (n samples, c correct)"),
        _field("scoring", pa.string(), True, "own (each problem's own verifier) or the verifier that re-scored them"),
    ]),
))

EVAL_ROLLOUTS = register(TableSpec(
    name="eval_rollouts",
    partition_by=("model_version",),
    description="Every held-out response an evaluation sampled, with its score: what lets an evaluation be "
                "re-scored with another verifier without sampling again, and pass@k be computed.",
    schema=pa.schema([
        _field("model_version", pa.int64(), False),
        _field("scoring", pa.string(), False, "own (each problem's own verifier) or the verifier that re-scored them"),
        _field("response_id", pa.string(), False, "eval-v{version}-{problem_id}-s{sample}: the same across re-scores"),
        _field("problem_id", pa.string(), False),
        _field("source", pa.string(), True),
        _field("level", pa.int8(), True),
        _field("sample_idx", pa.int32(), False),
        _field("response", pa.string(), False),
        _field("n_tokens", pa.int32(), True),
        _field("finish_reason", pa.string(), True, "stop or length"),
        _field("verifier", pa.string(), False),
        _field("verifier_version", pa.string(), False),
        _field("reward", pa.float64(), False),
        _field("correct", pa.bool_(), True),
        _field("details", pa.string(), True, "JSON: the verdict's details"),
        _field("sampler", pa.string(), True, "JSON: how the responses were sampled"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), True),
    ]),
))

ITERATION_METRICS = register(TableSpec(
    name="iteration_metrics",
    partition_by=("iteration",),
    description="One row per loop iteration: sampling, filtering, training and evaluation at a glance.",
    schema=pa.schema([
        _field("iteration", pa.int64(), False),
        _field("model_version", pa.int64(), False, "version that sampled the iteration"),
        _field("trained_version", pa.int64(), True, "version the iteration's training step registered"),
        _field("rounds", pa.int64(), True),
        _field("groups", pa.int64(), True),
        _field("groups_kept", pa.int64(), True),
        _field("filtered_share", pa.float64(), True),
        _field("learning_zone_share", pa.float64(), True),
        _field("mean_reward", pa.float64(), True),
        _field("solve_rate_by_level", pa.string(), True, "JSON: training groups' solve rate per level"),
        _field("mean_staleness", pa.float64(), True),
        _field("loss", pa.float64(), True),
        _field("clip_fraction", pa.float64(), True),
        _field("entropy", pa.float64(), True),
        _field("eval_solve_rate", pa.float64(), True, "held-out sampled solve rate of trained_version"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
    ]),
))

CURRICULUM = register(TableSpec(
    name="curriculum",
    partition_by=("iteration",),
    description="Each rebalancing of the level mix: the measured solve rate and the old and new weight per level.",
    schema=pa.schema([
        _field("iteration", pa.int64(), False, "the mix applies from the next iteration on"),
        _field("level", pa.int8(), False),
        _field("solve_rate", pa.float64(), True, "training groups' mean solve rate over the measured iterations"),
        _field("old_weight", pa.float64(), False),
        _field("new_weight", pa.float64(), False),
        _field("reason", pa.string(), False, "in_zone, too_easy, too_hard, between or unmeasured"),
        _field("run_id", pa.string(), False),
    ]),
))

GYM_CURRICULUM = register(TableSpec(
    name="gym_curriculum",
    partition_by=("iteration",),
    description="Each difficulty decision for a reasoning-gym source: its solve rate at its current curriculum "
                "step, the step before and after, and the bank version holding the new step's problems.",
    schema=pa.schema([
        _field("iteration", pa.int64(), False, "the difficulty applies from the next iteration on"),
        _field("source", pa.string(), False, "the gym source's name in problems, e.g. gym:chain_sum"),
        _field("dataset", pa.string(), False, "the reasoning-gym dataset"),
        _field("solve_rate", pa.float64(), True, "mean solve rate of the groups measured at old_step"),
        _field("groups", pa.int64(), False, "training groups measured at old_step over the measured iterations"),
        _field("old_step", pa.int64(), False, "curriculum step (every attribute at this level, capped) before"),
        _field("new_step", pa.int64(), False, "curriculum step after; equal to old_step when it stays"),
        _field("max_step", pa.int64(), False, "the dataset's hardest step"),
        _field("reason", pa.string(), False, "too_easy, too_hard, too_easy_at_max, too_hard_at_min, in_zone, "
               "between, unmeasured or step_rejected"),
        _field("old_params", pa.string(), False, "JSON: the dataset parameters at old_step"),
        _field("new_params", pa.string(), False, "JSON: the dataset parameters at new_step"),
        _field("bank_version", pa.int64(), True, "bank version that added the new step's problems (moves only)"),
        _field("problems", pa.int64(), True, "problems that bank version kept for this source"),
        _field("seed", pa.int64(), True, "seed the new step's problems were generated with"),
        _field("run_id", pa.string(), False),
    ]),
))

PUBLICATIONS = register(TableSpec(
    name="publications",
    partition_by=(),
    description="Each time a model version was published to an inference server: loaded, already served or "
                "failed (with why), and which older versions the server unloaded. Appended, one commit a publish.",
    schema=pa.schema([
        _field("model_version", pa.int64(), False),
        _field("served_name", pa.string(), False, "the name the server serves it by (what rollout requests)"),
        _field("endpoint", pa.string(), False, "the server's base URL"),
        _field("path", pa.string(), False, "the folder the server was told to load (after path_map)"),
        _field("action", pa.string(), False, "loaded, already_served or failed"),
        _field("error", pa.string(), True, "why it failed: the server's answer or the connection error"),
        _field("unloaded", pa.list_(pa.string()), True, "older versions the server unloaded (max_loras)"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
        _field("method", pa.string(), True, "adapter (load_lora_adapter by name) or full (weights swapped in place "
               "through the worker extension)"),
        _field("seconds", pa.float64(), True, "how long the load took, confirmation included (loads only)"),
    ]),
))

LOGPROB_CHECKS = register(TableSpec(
    name="logprob_checks",
    partition_by=(),
    description="The log-prob agreement gate: per endpoint and model version, how far the server's behaviour "
                "log-probs of a few sampled responses are from the trainer's recomputation. Appended by the loop "
                "on each version it publishes and by `rlvr policy check`.",
    schema=pa.schema([
        _field("model_version", pa.int64(), False),
        _field("served_name", pa.string(), False, "the name the server was asked for"),
        _field("endpoint", pa.string(), False, "the server's base URL"),
        _field("tokens", pa.int64(), False, "response tokens compared"),
        _field("mean_abs_delta", pa.float64(), False, "mean over tokens of |server log p - trainer log p|"),
        _field("max_abs_delta", pa.float64(), False, "largest |server log p - trainer log p| of one token"),
        _field("ratio_min", pa.float64(), False, "smallest exp(trainer - server): the importance ratio before any update"),
        _field("ratio_max", pa.float64(), False, "largest such ratio"),
        _field("ratio_std", pa.float64(), False, "standard deviation of the ratios (0 when the two agree)"),
        _field("prompt_tokens_match", pa.bool_(), False, "the server conditioned on the prompt ids the hf backend would"),
        _field("tolerance", pa.float64(), False, "rollout.logprob_tolerance: the most mean_abs_delta may be"),
        _field("passed", pa.bool_(), False, "mean_abs_delta within tolerance and the prompt tokens match"),
        _field("causes", pa.list_(pa.string()), True, "likely causes, most specific first, when it failed"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
    ]),
))

PROPOSALS = register(TableSpec(
    name="proposals",
    partition_by=("iteration",),
    unique=("proposal_id",),
    description="Every task a model proposed (self-play, tasks/selfplay): who proposed it, what the executor "
                "said of it, the problem a valid one became, and the solver's solve rate once solved.",
    schema=pa.schema([
        _field("proposal_id", pa.string(), False, "the proposer rollout's id with a p- prefix"),
        _field("iteration", pa.int64(), False),
        _field("role", pa.string(), False, "proposer (Absolute Zero) or challenger (SPICE)"),
        _field("task_type", pa.string(), False, "deduction, abduction or induction"),
        _field("model_version", pa.int64(), False, "the proposer's model version"),
        _field("rollout_id", pa.string(), False, "the proposer rollout that wrote it"),
        _field("document_id", pa.string(), True, "the source document of a grounded task (SPICE)"),
        _field("span", pa.string(), True, "the document span the task cites (SPICE)"),
        _field("verdict", pa.string(), False, "valid or invalid"),
        _field("reason", pa.string(), True, "why invalid: unparseable, does_not_run, not_deterministic, "
               "forbidden_import, too_slow, output_too_large, not_a_literal, duplicate"),
        _field("detail", pa.string(), True, "the executor's message"),
        _field("task_key", pa.string(), True, "hash of the program's syntax tree and inputs: equal for duplicates"),
        _field("shape_key", pa.string(), True, "hash of the syntax tree with constants abstracted: equal for "
               "near-duplicates"),
        _field("program", pa.string(), True),
        _field("inputs", pa.string(), True, "JSON: each call's argument tuple"),
        _field("outputs", pa.string(), True, "JSON: each call's output, from the sandbox"),
        _field("problem_id", pa.string(), True, "the problem a valid proposal became"),
        _field("solve_rate", pa.float64(), True, "the solver's solve rate on it this iteration"),
        _field("reward", pa.float64(), True, "the proposer's reward: learnability, or the invalid reward"),
        _field("run_id", pa.string(), False),
        _field("created_at", pa.timestamp("us", tz="UTC"), False),
    ]),
))
