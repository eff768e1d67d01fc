"""`rlvr bench compare --base REF`: the fast benchmarks on REF's code and on this working tree, in one run.

The step before merging a change to loop code (docs/benchmarks.md): each benchmark runs in fresh processes
importing one tree's code (the same interpreter and packages; a git worktree of REF made for the run), the
two sides alternating so that a host that speeds up or slows down meanwhile moves both, `repeats` times; the
medians are compared. A figure is a cost (seconds) or a rate (items a second); `slowdown` is this tree's cost
over REF's (a rate's inverse), and a slowdown past 1 + `threshold` (15 % by default) is a regression: the
command exits 1. Nothing is saved: the answer is about two commits on this host today, not a figure to print.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.docs import value_at
from bench.results import ROOT
from bench.worktrees import BIN, rlvr_seconds, worktree

THRESHOLD = 0.15


@dataclass(frozen=True)
class Probe:
    """A benchmark run small enough to repeat, and the figures of its JSON result that are compared."""

    arguments: tuple[str, ...]  # after `rlvr bench`, options REF's command line has too
    figures: dict[str, tuple[str, str]]  # label -> (path in the result's figures, "seconds" or "rate")


# Sizes chosen so a run takes seconds to a minute here while the timed part stays well above noise.
PROBES = {
    "advantages": Probe(("advantages", "--groups", "200000"), {"ours seconds": ("ours.seconds", "seconds")}),
    "verify": Probe(
        ("verify", "--limit", "400", "--repeats", "1"),
        {"numeric items/s": ("numeric.rate", "rate"), "symbolic items/s": ("symbolic.rate", "rate")},
    ),
    "sandbox": Probe(("sandbox",), {"runs/s": ("rate", "rate")}),
    "train": Probe(("train", "--repeats", "3"), {"ours tokens/s": ("ours_tokens_per_second", "rate")}),
    "sampling": Probe(
        ("sampling", "--shape", "tiny", "--repeats", "2"), {"hf tokens/s": ("shapes[0].hf_tokens_per_s", "rate")}
    ),
    "startup": Probe((), {"rlvr --help seconds": ("help", "seconds"), "rlvr sql seconds": ("sql", "seconds")}),
}


def environment(tree: Path, lake: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "RLVR_LAKE": lake}


def run_probe(name: str, tree: Path, lake: str) -> dict[str, float]:
    """One run of a probe on one tree's code: each compared figure's value."""
    probe = PROBES[name]
    if name == "startup":  # the startup benchmark makes a worktree itself: time the commands
        return {
            label: rlvr_seconds(command, tree, lake)
            for label, command in (
                ("rlvr --help seconds", ["--help"]),
                ("rlvr sql seconds", ["sql", "select 1 as one"]),
            )
        }
    done = subprocess.run(
        [str(BIN / "rlvr"), "bench", *probe.arguments, "--format", "json"],
        env=environment(tree, lake),
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`rlvr bench {' '.join(probe.arguments)}` failed on {tree} (exit {done.returncode}): "
            f"{done.stderr.strip()[-1500:]}"
        )
    try:
        outcome = json.loads(done.stdout)
        return {
            label: float(value_at({"r": outcome}, f"r.figures.{path}")) for label, (path, _) in probe.figures.items()
        }
    except (ValueError, KeyError, IndexError, TypeError) as error:  # REF's benchmark speaks another result
        raise RuntimeError(
            f"`rlvr bench {' '.join(probe.arguments)}` on {tree} gave no {list(probe.figures)} "
            f"({error!r}): its result has another shape at that commit"
        ) from None


def slowdown(kind: str, here: float, base: float) -> float:
    """This tree's cost over the base's: above 1 is slower."""
    return here / base if kind == "seconds" else base / here


def compare(
    base: str,
    names: list[str],
    repeats: int = 3,
    threshold: float = THRESHOLD,
    runner: Callable[[str, Path, str], dict[str, float]] = run_probe,
    say: Callable[[str], None] = print,
) -> dict:
    """Each probe `repeats` times on both sides, alternating (a warm-up run of each side first, not counted)."""
    unknown = sorted(set(names) - set(PROBES))
    if unknown:
        raise ValueError(f"no fast benchmark {unknown[0]!r}: choose from {', '.join(PROBES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-compare-") as work, worktree(base) as (base_tree, commit):
        sides = {"here": ROOT, "base": base_tree}
        for name in names:
            values: dict[str, dict[str, list[float]]] = {"here": {}, "base": {}}
            for side, tree in sides.items():
                runner(name, tree, str(Path(work) / f"lake-{side}"))  # warm caches, bytecode, the lake
            for repeat in range(repeats):
                order = ("base", "here") if repeat % 2 == 0 else ("here", "base")
                for side in order:
                    for label, value in runner(name, sides[side], str(Path(work) / f"lake-{side}")).items():
                        values[side].setdefault(label, []).append(value)
            for label, (_, kind) in PROBES[name].figures.items():
                here, there = statistics.median(values["here"][label]), statistics.median(values["base"][label])
                factor = slowdown(kind, here, there)
                rows.append(
                    {
                        "benchmark": name,
                        "figure": label,
                        "kind": kind,
                        "here": here,
                        "base": there,
                        "here_runs": values["here"][label],
                        "base_runs": values["base"][label],
                        "slowdown": factor,
                        "regressed": factor > 1 + threshold,
                    }
                )
                say(
                    f"{name}: {label} {here:,.4g} here, {there:,.4g} at {commit[:7]}: ×{factor:.3f} the cost"
                    + ("  REGRESSED" if factor > 1 + threshold else "")
                )
    return {
        "base": commit,
        "threshold": threshold,
        "repeats": repeats,
        "rows": rows,
        "regressed": [f"{row['benchmark']}: {row['figure']}" for row in rows if row["regressed"]],
    }
