"""The tables of the stages around the loop's core: evaluations, per-iteration metrics, the curriculum, publishing
a version to servers, the log-prob agreement gate, self-play's proposals and the sampler-trainer mismatch. `storage/schemas.py` adds them to
the contract (`TABLES`)."""

from __future__ import annotations

import pyarrow as pa

from storage.table_spec import TableSpec, column

EVALUATIONS = TableSpec(
    name="evaluations",
    partition_by=(),
    slice_by=("model_version",),
    description="Held-out solve rate of a model version, per source and level (sampled responses).",
    schema=pa.schema(
        [
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
            column(
                "pass_at_k", pa.float64(), True, "mean over problems of 1 - C(n-c, k) / C(n, k) (n samples, c correct)"
            ),
            column(
                "scoring", pa.string(), True, "own (each problem's own verifier) or the verifier that re-scored them"
            ),
        ]
    ),
)

EVAL_ROLLOUTS = TableSpec(
    name="eval_rollouts",
    partition_by=(),
    slice_by=("model_version",),
    description="Every held-out response an evaluation sampled, with its score: what lets an evaluation be "
    "re-scored with another verifier without sampling again, and pass@k be computed.",
    schema=pa.schema(
        [
            column("model_version", pa.int64(), False),
            column(
                "scoring", pa.string(), False, "own (each problem's own verifier) or the verifier that re-scored them"
            ),
            column(
                "response_id", pa.string(), False, "eval-v{version}-{problem_id}-s{sample}: the same across re-scores"
            ),
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
        ]
    ),
)

ITERATION_METRICS = TableSpec(
    name="iteration_metrics",
    partition_by=(),
    slice_by=("iteration",),
    description="One row per loop iteration: sampling, filtering, training and evaluation at a glance.",
    schema=pa.schema(
        [
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
            column(
                "mean_self_certainty",
                pa.float64(),
                True,
                "INTUITOR's self-certainty, mean over the iteration's rollouts that have one",
            ),
            column("mismatch_mean_abs_delta", pa.float64(), True, "the step's mean |log p_trainer - log p_behaviour|"),
            column("mismatch_kl_k3", pa.float64(), True, "the step's mean k3 KL(behaviour || trainer) per token"),
            column("mismatch_outside_share", pa.float64(), True, "share of tokens outside the correction's bounds"),
            column("correction_masked_share", pa.float64(), True, "share of tokens the correction weighed 0"),
        ]
    ),
)

CURRICULUM = TableSpec(
    name="curriculum",
    partition_by=(),
    slice_by=("iteration",),
    description="Each rebalancing of the level mix: the measured solve rate and the old and new weight per level.",
    schema=pa.schema(
        [
            column("iteration", pa.int64(), False, "the mix applies from the next iteration on"),
            column("level", pa.int8(), False),
            column("solve_rate", pa.float64(), True, "training groups' mean solve rate over the measured iterations"),
            column("old_weight", pa.float64(), False),
            column("new_weight", pa.float64(), False),
            column("reason", pa.string(), False, "in_zone, too_easy, too_hard, between or unmeasured"),
            column("run_id", pa.string(), False),
        ]
    ),
)

GYM_CURRICULUM = TableSpec(
    name="gym_curriculum",
    partition_by=(),
    slice_by=("iteration",),
    description="Each difficulty decision for a reasoning-gym source: its solve rate at its current curriculum "
    "step, the step before and after, and the bank version holding the new step's problems.",
    schema=pa.schema(
        [
            column("iteration", pa.int64(), False, "the difficulty applies from the next iteration on"),
            column("source", pa.string(), False, "the gym source's name in problems, e.g. gym:chain_sum"),
            column("dataset", pa.string(), False, "the reasoning-gym dataset"),
            column("solve_rate", pa.float64(), True, "mean solve rate of the groups measured at old_step"),
            column("groups", pa.int64(), False, "training groups measured at old_step over the measured iterations"),
            column("old_step", pa.int64(), False, "curriculum step (every attribute at this level, capped) before"),
            column("new_step", pa.int64(), False, "curriculum step after; equal to old_step when it stays"),
            column("max_step", pa.int64(), False, "the dataset's hardest step"),
            column(
                "reason",
                pa.string(),
                False,
                "too_easy, too_hard, too_easy_at_max, too_hard_at_min, in_zone, between, unmeasured or step_rejected",
            ),
            column("old_params", pa.string(), False, "JSON: the dataset parameters at old_step"),
            column("new_params", pa.string(), False, "JSON: the dataset parameters at new_step"),
            column("bank_version", pa.int64(), True, "bank version that added the new step's problems (moves only)"),
            column("problems", pa.int64(), True, "problems that bank version kept for this source"),
            column("seed", pa.int64(), True, "seed the new step's problems were generated with"),
            column("run_id", pa.string(), False),
        ]
    ),
)

PUBLICATIONS = TableSpec(
    name="publications",
    partition_by=(),
    description="Each time a model version was published to an inference server: loaded, already served or "
    "failed (with why), and which older versions the server unloaded. Appended, one commit a publish.",
    schema=pa.schema(
        [
            column("model_version", pa.int64(), False),
            column("served_name", pa.string(), False, "the name the server serves it by (what rollout requests)"),
            column("endpoint", pa.string(), False, "the server's base URL"),
            column("path", pa.string(), False, "the folder the server was told to load (after path_map)"),
            column("action", pa.string(), False, "loaded, already_served or failed"),
            column("error", pa.string(), True, "why it failed: the server's answer or the connection error"),
            column("unloaded", pa.list_(pa.string()), True, "older versions the server unloaded (max_loras)"),
            column("run_id", pa.string(), False),
            column("created_at", pa.timestamp("us", tz="UTC"), False),
            column(
                "method",
                pa.string(),
                True,
                "adapter (load_lora_adapter by name) or full (weights swapped in place through the worker extension)",
            ),
            column("seconds", pa.float64(), True, "how long the load took, confirmation included (loads only)"),
        ]
    ),
)

LOGPROB_CHECKS = TableSpec(
    name="logprob_checks",
    partition_by=(),
    description="The log-prob agreement gate: per endpoint and model version, how far the server's behaviour "
    "log-probs of a few sampled responses are from the trainer's recomputation. Appended by the loop "
    "on each version it publishes and by `rlvr policy check`.",
    schema=pa.schema(
        [
            column("model_version", pa.int64(), False),
            column("served_name", pa.string(), False, "the name the server was asked for"),
            column("endpoint", pa.string(), False, "the server's base URL"),
            column("tokens", pa.int64(), False, "response tokens compared"),
            column("mean_abs_delta", pa.float64(), False, "mean over tokens of |server log p - trainer log p|"),
            column("max_abs_delta", pa.float64(), False, "largest |server log p - trainer log p| of one token"),
            column(
                "ratio_min",
                pa.float64(),
                False,
                "smallest exp(trainer - server): the importance ratio before any update",
            ),
            column("ratio_max", pa.float64(), False, "largest such ratio"),
            column("ratio_std", pa.float64(), False, "standard deviation of the ratios (0 when the two agree)"),
            column(
                "prompt_tokens_match",
                pa.bool_(),
                False,
                "the server conditioned on the prompt ids the hf backend would",
            ),
            column("tolerance", pa.float64(), False, "rollout.logprob_tolerance: the most mean_abs_delta may be"),
            column("passed", pa.bool_(), False, "mean_abs_delta within tolerance and the prompt tokens match"),
            column("causes", pa.list_(pa.string()), True, "likely causes, most specific first, when it failed"),
            column("run_id", pa.string(), False),
            column("created_at", pa.timestamp("us", tz="UTC"), False),
        ]
    ),
)

PROPOSALS = TableSpec(
    name="proposals",
    partition_by=(),
    slice_by=("iteration",),
    unique=("proposal_id",),
    description="Every task a model proposed (self-play, tasks/selfplay): who proposed it, what the executor "
    "said of it, the problem a valid one became, and the solver's solve rate once solved.",
    schema=pa.schema(
        [
            column("proposal_id", pa.string(), False, "the proposer rollout's id with a p- prefix"),
            column("iteration", pa.int64(), False),
            column("role", pa.string(), False, "proposer (Absolute Zero) or challenger (SPICE)"),
            column("task_type", pa.string(), False, "deduction, abduction or induction"),
            column("model_version", pa.int64(), False, "the proposer's model version"),
            column("rollout_id", pa.string(), False, "the proposer rollout that wrote it"),
            column("document_id", pa.string(), True, "the source document of a grounded task (SPICE)"),
            column("span", pa.string(), True, "the document span the task cites (SPICE)"),
            column("verdict", pa.string(), False, "valid or invalid"),
            column(
                "reason",
                pa.string(),
                True,
                "why invalid: unparseable, does_not_run, not_deterministic, "
                "forbidden_import, too_slow, output_too_large, not_a_literal, duplicate",
            ),
            column("detail", pa.string(), True, "the executor's message"),
            column("task_key", pa.string(), True, "hash of the program's syntax tree and inputs: equal for duplicates"),
            column(
                "shape_key",
                pa.string(),
                True,
                "hash of the syntax tree with constants abstracted: equal for near-duplicates",
            ),
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
        ]
    ),
)

MISMATCH = TableSpec(
    name="mismatch",
    partition_by=(),
    slice_by=("iteration",),
    description="The sampler-trainer gap of every trained rollout (trainers/mismatch.py): per token "
    "log p_trainer - log p_behaviour, and the row's figures. Written by the training stage; `rlvr analyze "
    "mismatch` replays the corrections on it.",
    schema=pa.schema(
        [
            column("rollout_id", pa.string(), False),
            column("iteration", pa.int64(), False),
            column("model_version", pa.int64(), False, "the version trained from, whose log-probs these are"),
            column("trained_version", pa.int64(), False, "the version the step registered"),
            column("log_ratio", pa.list_(pa.float64()), False, "per response token: log p_trainer - log p_behaviour"),
            column("n_tokens", pa.int64(), False, "response tokens the loss saw"),
            column(
                "after_updates", pa.int64(), False, "optimizer steps before the trainer's log-probs (0: batch start)"
            ),
            column("mean_abs_delta", pa.float64(), False, "mean over tokens of |log-ratio|"),
            column("max_abs_delta", pa.float64(), False, "largest |log-ratio| of one token"),
            column("sequence_log_ratio", pa.float64(), False, "sum of the log-ratios: the sequence's log IS ratio"),
            column("kl_k3", pa.float64(), False, "mean over tokens of exp(d) - 1 - d: k3 KL(behaviour || trainer)"),
            column("outside_share", pa.float64(), False, "share of tokens whose ratio is outside the run's bounds"),
            column("correction", pa.string(), False, "train.rollout_correction's mode (decoupled: token_tis)"),
            column("run_id", pa.string(), False),
        ]
    ),
)

STAGE_TABLES = (
    MISMATCH,
    EVALUATIONS,
    EVAL_ROLLOUTS,
    ITERATION_METRICS,
    CURRICULUM,
    GYM_CURRICULUM,
    PUBLICATIONS,
    LOGPROB_CHECKS,
    PROPOSALS,
)
