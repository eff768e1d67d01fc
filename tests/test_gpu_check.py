"""The GPU check (`infra/gpu/check.py`) runs on a host that has torch and transformers and nothing else of
the platform's stack: here on the CPU, in a Python that sees only the distributions torch, transformers,
accelerate and peft install (no Prefect, Polars, Delta, DuckDB, PyArrow), two data-parallel processes on gloo."""

import json
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement

from conftest import ROOT

GPU_HOST = ["torch", "transformers", "accelerate", "peft"]
PLATFORM_ONLY = ["prefect", "polars", "deltalake", "duckdb", "pyarrow"]


def installed_with(names: list[str]) -> list:
    """The distributions `pip install names` brings, found among this environment's."""
    found, todo = {}, list(names)
    while todo:
        dist = distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def bare_site(folder: Path) -> Path:
    """A folder of links to exactly those distributions' files: a GPU host's site-packages."""
    folder.mkdir()
    for dist in installed_with(GPU_HOST):
        root = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, target = root / top, folder / top
            if source.exists() and not target.exists() and top != "..":
                target.symlink_to(source)
    return folder


def run_check(tmp_path, *args: str) -> dict:
    site = bare_site(tmp_path / "site")
    assert not any((site / name).exists() for name in PLATFORM_ONLY)       # the closure holds none of them
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(site), "RLVR_TORCH_THREADS": "1"}
    result = subprocess.run([sys.executable, "-S", str(ROOT / "infra" / "gpu" / "check.py"), "--device", "cpu",
                             "--shape", "tiny", "--batch", "8", "--prompt-tokens", "8", "--new-tokens", "16",
                             "--train-steps", "2", *args], capture_output=True, text=True, timeout=300, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return {part["part"]: part for part in map(json.loads, result.stdout.splitlines())}


def test_the_gpu_check_needs_only_what_torch_and_transformers_install(tmp_path):
    parts = run_check(tmp_path, "--processes", "2")
    assert parts["device"]["device"] == "cpu" and parts["sampling"]["generate_tokens_per_s"] > 0
    assert parts["sampling"]["ratio_hf_to_generate"] > 0          # the project's sampler imported without the stack
    assert parts["logprob_gap"]["ok"] and parts["logprob_gap"]["max_abs_gap"] < 1e-4
    assert parts["training"]["dtype"] == "bfloat16" and parts["training"]["tokens_per_s"] > 0
    parallel = parts["data_parallel"]
    assert parallel["processes"] == 2 and parallel["backend"] == "gloo" and parallel["ok"], parallel
