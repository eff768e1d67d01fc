"""Prefect flows that wire configs and tables to the stages (curation, one iteration, the loop and its overlapped
variant, re-runs, evaluation, publishing, the report), deployments, the temporary Prefect server, and the `rlvr`
command line (`flows/cli/`, a tree of command groups).

May import: `trainers`, `tasks`, `policy` and `storage` (the `floors` contract); never `bench` (the benchmarks' command group
plugs into the command line through an entry point instead). Nothing outside `flows/cli/` imports the command line."""
