"""Another commit's code beside this checkout, for benchmarks that compare two commits in one run."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.results import ROOT


@contextmanager
def worktree(revision: str) -> Iterator[tuple[Path, str]]:
    """A detached git worktree of `revision` in a temporary folder and its full commit id; removed afterwards.
    Code is imported from it by putting it first on PYTHONPATH (the editable install's finder comes after).
    `../shared` is linked beside it when this checkout has one, so both trees read the same datasets."""
    resolved = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                              capture_output=True, text=True)
    if resolved.returncode != 0:
        raise ValueError(f"{revision!r} is not a commit of {ROOT}")
    folder = Path(tempfile.mkdtemp(prefix="rlvr-bench-worktree-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(folder), revision],
                   check=True)
    try:
        if (ROOT.parent / "shared").is_dir():
            (folder.parent / "shared").symlink_to(ROOT.parent / "shared")
        yield folder, resolved.stdout.strip()
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)],
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(folder.parent, ignore_errors=True)
