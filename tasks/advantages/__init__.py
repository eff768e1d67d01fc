"""Group-relative advantages, DAPO overlong shaping, staleness: pure functions over Polars frames; the stage that
turns an iteration's stored rollouts and rewards into groups, advantages and the batch.

May import: storage, storage.config, tasks.rewards, policy (behaviour log-probs recomputed),
tasks.sampling (the keep rule), tasks.verification.stage, tasks.verifiers."""
