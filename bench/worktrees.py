"""Another commit's code beside this checkout, for benchmarks that compare two commits in one run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.results import ROOT


@contextmanager
def worktree(revision: str) -> Iterator[tuple[Path, str]]:
    """A detached git worktree of `revision` in a temporary folder and its full commit id; removed afterwards.
    Code is imported from it by putting it first on PYTHONPATH (the editable install's finder comes after).
    `../shared` is linked beside it when this checkout has one, so both trees read the same datasets."""
    resolved = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise ValueError(f"{revision!r} is not a commit of {ROOT}")
    folder = Path(tempfile.mkdtemp(prefix="rlvr-bench-worktree-")) / "tree"
    try:
        added = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(folder), revision],
            capture_output=True,
            text=True,
        )
        if added.returncode != 0:
            raise RuntimeError(f"git worktree add {revision} failed: {added.stderr.strip()[-500:]}")
        if (ROOT.parent / "shared").is_dir():
            (folder.parent / "shared").symlink_to(ROOT.parent / "shared")
        yield folder, resolved.stdout.strip()
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], stderr=subprocess.DEVNULL
        )
        shutil.rmtree(folder.parent, ignore_errors=True)


BIN = Path(sys.executable).parent


def rlvr_seconds(arguments: list[str], tree: Path, lake: str) -> float:
    """Wall time of one `rlvr` process importing the code of `tree` (the same interpreter and packages)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "RLVR_LAKE": lake}
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "rlvr"), *arguments], env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`rlvr {' '.join(arguments)}` failed on {tree} (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    return time.perf_counter() - started
