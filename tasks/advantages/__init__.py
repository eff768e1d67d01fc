"""Group-relative advantages, DAPO shaping and filtering, staleness: pure functions over Polars frames.

May import: storage, storage.config, tasks.rewards, policy (behaviour log-probs recomputed), tasks.verification.stage,
tasks.verifiers."""
