"""The lake, the lowest floor: table schemas, transactional and conditional writes, runs and which rows are visible,
leases, the locked-down DuckDB catalog and its views, lineage, `rlvr doctor`'s checks, the model registry's rows
(`registry.py`); and what every floor above reads: the base of typed configs and YAML loading (`config.py`, its
errors in `config_errors.py`), progress bars (`progress.py`) and seeds derived from names (`seeds.py`).

May import: no other package of the project (import-linter's `floors` contract); never Prefect or Typer."""
