"""A benchmark's result as one JSON object: its figures, the parameters it ran with, the commit and the host.

`rlvr bench … --format json` prints it; `--save NAME` writes it to `bench/results/NAME.json`, the one source of the
figures in docs/benchmarks.md and the README (`python -m bench.docs` renders them). A result names the files its
figures depend on (the benchmark module's `DEPENDS_ON`): once one of them changes after the result's commit, the
result describes older code, and `rlvr bench stale` lists it with the command that refreshes it (bench/stale.py);
a regression is found by comparing two commits in one run (`rlvr bench compare`, bench/compare.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True, check=True).stdout


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty elsewhere)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_id() -> str | None:
    """Which processor generation this is: "AMD EPYC" names several (family 25 model 1 is Zen 3, model 17 Zen 4)."""
    fields = cpu_info()
    if "cpu family" not in fields:
        return None
    return f"{fields.get('vendor_id', '?')} family {fields['cpu family']} model {fields.get('model', '?')}"


TORCH_LEVELS = ("default", "avx2", "avx512")


def instruction_set() -> str:
    """The vector instructions torch's CPU kernels use here (AVX2 or AVX-512, as torch decides from the CPU's
    flags, lowered by ATEN_CPU_CAPABILITY): they sum floats in different orders, so a run is bit-reproducible
    only on the same instruction set (tests/trainers/test_reproducibility.py). Read from torch when it is imported."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.backends.cpu.get_cpu_capability().lower()
    flags = set(cpu_info().get("flags", "").split())
    best = (
        "avx512"
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
        else "avx2"
        if {"avx2", "fma"} <= flags
        else "default"
    )
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    return asked if asked in TORCH_LEVELS and TORCH_LEVELS.index(asked) < TORCH_LEVELS.index(best) else best


def host() -> dict[str, Any]:
    """The machine, and how busy it was (load averages over 1, 5 and 15 minutes as the run ended): a ratio measured
    beside other work is on record as such."""
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "isa": instruction_set(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def jsonable(value: Any) -> Any:
    """Figures as JSON: dataclasses as dicts (with `passed` where they have it), tuples as lists, NaN as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({**dataclasses.asdict(value), **({"passed": value.passed} if hasattr(value, "passed") else {})})
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(item) for item in value]
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # a NumPy or torch scalar
        return jsonable(value.item())
    return str(value)


def code_state(depends_on: tuple[str, ...]) -> dict[str, Any]:
    """The commit checked out and whether the files a benchmark depends on differ from it (None outside git)."""
    try:
        return {
            "commit": git("rev-parse", "HEAD").strip(),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", *depends_on).strip()),
        }
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (a source archive)
        return {"commit": None, "dirty": None}


def envelope(
    name: str,
    figures: Any,
    parameters: dict[str, Any],
    depends_on: tuple[str, ...],
    started: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result object: what was measured, with what, on which code and machine. `started` is the code's state
    when the run began (`code_state`): the result names that commit, and is dirty if what it depends on was
    uncommitted then or now, or was committed anew during the run."""
    ended = code_state(depends_on)
    state = started or ended
    if started and started["commit"] and ended["commit"] != started["commit"]:
        state = {
            **started,
            "dirty": started["dirty"]
            or bool(git("diff", "--name-only", started["commit"], ended["commit"], "--", *depends_on).strip()),
        }
    dirty = None if state["dirty"] is None else bool(state["dirty"] or ended["dirty"])
    return {
        "benchmark": name,
        "figures": jsonable(figures),
        "parameters": jsonable(parameters),
        "commit": state["commit"],
        "dirty": dirty,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": host(),
        "depends_on": list(depends_on),
    }


def save(result: dict[str, Any], name: str, folder: Path = RESULTS) -> Path:
    """Write `result` to `folder`/NAME.json (sorted keys, so a re-run's diff shows only what changed)."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--save {name!r}: a result name is letters, digits, '-' and '_'")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return path


def load_results(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every saved result by name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def changed_since(result: dict[str, Any], also: tuple[str, ...] = ()) -> list[str]:
    """The files the result depends on (as recorded, and `also`: what its benchmark names today) that changed
    between its commit and the working tree (uncommitted changes count: the figures no longer describe them)."""
    paths = sorted(set(result["depends_on"]) | set(also))
    untracked = git("ls-files", "--others", "--exclude-standard", "--", *paths).split()
    return sorted(set(git("diff", "--name-only", result["commit"], "--", *paths).split()) | set(untracked))


# Each result's benchmark (the `benchmark` field, the name `rlvr bench` records) and the module that measures it.
MODULES = {
    "startup": "startup",
    "dedup": "dedup_scaling",
    "verify": "verify_throughput",
    "advantages": "advantages_scale",
    "sandbox": "sandbox_rate",
    "sandbox-files": "sandbox_files",
    "sandbox-hostile": "sandbox_hostile",
    "train": "train_throughput",
    "sampling": "sampling",
    "learning": "learning",
    "peer": "peer",
    "async": "overlap",
    "orchestration": "orchestration",
    "faults": "faults",
    "publish": "publish_time",
    "reward-serve": "reward_serve",
    "lake-scale": "lake_scale",
    "train-ranks": "train_ranks",
    "judge-guard": "judge_guard",
    "mismatch": "engine_mismatch",
    "mismatch-analysis": "mismatch_analysis",
    "correction": "correction_runs",
}


def depends_on(benchmark: str) -> tuple[str, ...]:
    """The files a benchmark's figures depend on today: its module's `DEPENDS_ON` (imported only when asked for)."""
    return importlib.import_module(f"bench.{MODULES[benchmark]}").DEPENDS_ON


# The code an RL run executes, for the benchmarks that run the loop (the command line's tree is not among it, nor
# trainer interop, the lake's upkeep and the deployments, which only the command line imports: the
# `interop-beside-the-loop` and `upkeep-beside-the-loop` contracts in pyproject.toml).
LOOP_CODE = (
    "storage/",
    "policy/",
    "tasks/",
    "trainers/",
    "flows/",
    ":(exclude)flows/cli/",
    ":(exclude)flows/reference.py",
    ":(exclude)tasks/interop/",
    ":(exclude)storage/doctor.py",
    ":(exclude)storage/maintenance.py",
    ":(exclude)flows/maintenance.py",
    ":(exclude)flows/deployments.py",
)
# Every floor below the benchmarks, for those that time the command line too.
ALL_CODE = ("storage/", "policy/", "tasks/", "trainers/", "flows/")
