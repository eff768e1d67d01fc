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

import pyarrow as pa

from storage.stage_tables import STAGE_TABLES
from storage.table_spec import PARQUET_WRITER, POST_COMMIT, TableSpec, column  # noqa: F401  (re-exported)

VERIFICATION_ROUND = 99  # the `round` of RISE's in-batch verification groups: after every resampling round

PROBLEMS = TableSpec(
    name="problems",
    partition_by=("bank_version",),
    unique=("problem_id",),  # the id hashes the split too: one row per problem and split
    description="The problem bank: one row per problem, added by the bank version that first curated it.",
    schema=pa.schema(
        [
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
        ]
    ),
)

QUARANTINE = TableSpec(
    name="quarantine",
    partition_by=("bank_version",),
    description="Rows rejected by validation, with the file, line, field and reason.",
    schema=pa.schema(
        [
            column("bank_version", pa.int64(), False),
            column("source", pa.string(), False),
            column("source_uri", pa.string(), False),
            column("source_line", pa.int64(), True),
            column("field", pa.string(), True, "the offending field, if one"),
            column("reason", pa.string(), False),
            column("raw", pa.string(), True, "the rejected row, truncated to 2,000 characters"),
            column("run_id", pa.string(), False),
        ]
    ),
)

DROPPED = TableSpec(
    name="dropped_problems",
    partition_by=("bank_version",),
    description="Valid problems left out of the bank by deduplication or decontamination.",
    schema=pa.schema(
        [
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
        ]
    ),
)

RUNS = TableSpec(
    name="runs",
    partition_by=(),
    description="The lineage spine: one row per stage run.",
    schema=pa.schema(
        [
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
        ]
    ),
)

ROLLOUTS = TableSpec(
    name="rollouts",
    partition_by=(),
    slice_by=("iteration",),
    description="Sampled responses: one row per (problem, sample) of an iteration's groups.",
    schema=pa.schema(
        [
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
            column(
                "behaviour_logprobs", pa.list_(pa.float32()), True, "log-probs of the sampled tokens under the sampler"
            ),
            column("n_tokens", pa.int32(), True),
            column("finish_reason", pa.string(), True, "stop or length"),
            column(
                "self_certainty",
                pa.float64(),
                True,
                "mean over response tokens of KL(uniform || next-token "
                "distribution); null where the backend gives no full distribution",
            ),
            column("backend", pa.string(), True, "hf or openai (with the endpoint that answered)"),
            column("sampler", pa.string(), True, "JSON: the full sampler config"),
            column("seed", pa.int64(), True, "seed of the generation call that produced the group"),
            column("run_id", pa.string(), False),
            column("created_at", pa.timestamp("us", tz="UTC"), True),
            column(
                "loss_mask",
                pa.list_(pa.int8()),
                True,
                "episodes: 1 on the model's response tokens, 0 on the "
                "tool's (never in the policy loss); null: every token is the model's",
            ),
            column("turns", pa.string(), True, "episodes, JSON: each segment's role (model or tool), text and tokens"),
            column("tool_calls", pa.int32(), True, "episodes: tool calls made"),
            column("tool_errors", pa.int32(), True, "episodes: tool calls that failed (an exception, a time-out)"),
            column(
                "drawn_as",
                pa.string(),
                True,
                "why selection drew the problem: unseen, zone, revisit, outside_zone, retired or predicted_uniform "
                "(tasks/sampling/selection.py); null: selection off",
            ),
        ]
    ),
)

REWARDS = TableSpec(
    name="rewards",
    partition_by=(),
    slice_by=("iteration",),
    description="Verifier verdicts on rollouts; one row per (rollout, verifier, verifier version).",
    schema=pa.schema(
        [
            column("iteration", pa.int64(), False),
            column("rollout_id", pa.string(), False),
            column("problem_id", pa.string(), False),
            column("verifier", pa.string(), False),
            column("verifier_version", pa.string(), False),
            column("reward", pa.float64(), False),
            column("correct", pa.bool_(), True, "null when the verifier cannot decide"),
            column("format_reward", pa.float64(), True, "answer given in the required form"),
            column("process_reward", pa.float64(), True, "step-level score, where the verifier computes one"),
            column(
                "corrected_reward",
                pa.float64(),
                True,
                "(R - rho0) / (1 - rho0 - rho1) with the verifier's audited noise",
            ),
            column("details", pa.string(), True, "JSON: extracted answer, failure reason, tests passed"),
            column("run_id", pa.string(), False),
            column(
                "composed_reward",
                pa.float64(),
                True,
                "the reward training sees: the reward config's weighted sum "
                "of components (tasks/rewards/compose.py); on the rollout's own verifier's row",
            ),
            column("reward_components", pa.string(), True, "JSON: each component's mapped value, null where absent"),
        ]
    ),
)

VERIFIER_NOISE = TableSpec(
    name="verifier_noise",
    partition_by=(),
    description="Audited error rates of a verifier version: false positives rho0, false negatives rho1.",
    schema=pa.schema(
        [
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
        ]
    ),
)

GROUPS = TableSpec(
    name="groups",
    partition_by=(),
    slice_by=("iteration",),
    description="One row per sampled group: reward statistics, solve rate, and what dynamic sampling did with it.",
    schema=pa.schema(
        [
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
            column(
                "filter_reason", pa.string(), True, "all_wrong, all_correct, outside_band, surplus, or null when kept"
            ),
            column("run_id", pa.string(), False),
        ]
    ),
)

ADVANTAGES = TableSpec(
    name="advantages",
    partition_by=(),
    slice_by=("iteration",),
    description="Per-rollout advantage with the estimator, the shaped reward and the freshness that produced it.",
    schema=pa.schema(
        [
            column("iteration", pa.int64(), False),
            column("rollout_id", pa.string(), False),
            column("group_id", pa.string(), False),
            column("problem_id", pa.string(), False),
            column("estimator", pa.string(), False),
            column("reward", pa.float64(), False, "the verifier's reward"),
            column("shaped_reward", pa.float64(), False, "after overlong shaping; what the estimator used"),
            column("advantage", pa.float64(), False),
            column("loss_mask", pa.float64(), False, "0 excludes the rollout from the loss (masked truncation, stale)"),
            column(
                "importance_weight",
                pa.float64(),
                True,
                "1 when fresh; truncated π_current/π_behaviour when acceptable; null when stale",
            ),
            column("staleness", pa.int64(), False),
            column("freshness", pa.string(), False, "fresh, acceptable or stale"),
            column("run_id", pa.string(), False),
        ]
    ),
)

BATCHES = TableSpec(
    name="batches",
    partition_by=(),
    slice_by=("iteration",),
    description="Exactly what a training step consumes: rollouts, their advantages and weights.",
    schema=pa.schema(
        [
            column("batch_id", pa.string(), False),
            column("iteration", pa.int64(), False),
            column("rollout_id", pa.string(), False),
            column("group_id", pa.string(), False),
            column("advantage", pa.float64(), False),
            column("weight", pa.float64(), False, "loss mask times importance weight (1 for fresh rollouts)"),
            column("run_id", pa.string(), False),
        ]
    ),
)

DBB_STATE = TableSpec(
    name="dbb_state",
    partition_by=(),
    slice_by=("iteration",),
    description="Discounted Beta-Bernoulli success state per problem after each iteration.",
    schema=pa.schema(
        [
            column("iteration", pa.int64(), False, "the state holds after this iteration"),
            column("problem_id", pa.string(), False),
            column("dbb_alpha", pa.float64(), False),
            column("dbb_beta", pa.float64(), False),
            column("run_id", pa.string(), False),
        ]
    ),
)

MODEL_VERSIONS = TableSpec(
    name="model_versions",
    partition_by=(),
    slice_by=("model_version",),
    description="The model registry: one row per policy version, with its parent and what produced it.",
    schema=pa.schema(
        [
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
        ]
    ),
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        PROBLEMS,
        QUARANTINE,
        DROPPED,
        RUNS,
        ROLLOUTS,
        REWARDS,
        VERIFIER_NOISE,
        GROUPS,
        ADVANTAGES,
        BATCHES,
        DBB_STATE,
        MODEL_VERSIONS,
        *STAGE_TABLES,
    )
}


def register(spec: TableSpec) -> TableSpec:
    """Add a table to the contract (later stages call this from their own schema modules)."""
    TABLES[spec.name] = spec
    return spec
