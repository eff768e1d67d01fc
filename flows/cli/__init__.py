"""The `rlvr` command line as a tree: `main.py` is the root (global options, the groups assembled), `common.py`
what every group shares, and one module per command group. A group imports `common` and the floors below
(flows, trainers, tasks, storage), never the root; the benchmarks' group lives in `bench/cli.py` and plugs in
through an entry point.

May import: the rest of `flows`, `trainers`, `tasks`, `policy`, `storage`; only `flows.cli`, `flows.reference` (the
generated reference pages) and `bench.cli` import it (the `cli-on-top` and `cli-tree` contracts)."""


def main() -> None:
    """The `rlvr` console entry point (pyproject.toml names `flows.cli:main`): the root in `main.py`, imported only
    here, so that importing a group's shared options does not assemble the whole tree."""
    from flows.cli.main import main as run_root

    run_root()
