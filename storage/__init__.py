"""The lake, the lowest floor: table schemas, transactional and conditional writes, runs and which rows are visible,
leases, the locked-down DuckDB catalog and its views, lineage, `rlvr doctor`'s checks; and what every stage that
touches a model reads: the model registry's rows (`registry.py`), checkpoints saved and loaded (`checkpoints.py`,
with the in-memory copies of recent ones in `policy_cache.py`) and torch's thread count (`threads.py`).

May import: no other package of the project (import-linter's `floors` contract); never Prefect or Typer."""
