"""The GPU check (`infra/gpu/check.py`) runs on a host that has torch and transformers and nothing else of
the platform's stack: here on the CPU, in a Python that sees only the distributions torch, transformers,
accelerate and peft install (no Prefect, Polars, Delta, DuckDB, PyArrow), two data-parallel processes on gloo.
Each part is isolated (an exception is its line, the next part runs), stdout holds JSON lines only, and
`check.sh` keeps stdout and stderr apart and goes on after a shape fails or runs out of time."""

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import distribution
from pathlib import Path

import pytest
from conftest import ROOT
from packaging.requirements import Requirement

GPU_HOST = ["torch", "transformers", "accelerate", "peft"]
PLATFORM_ONLY = ["prefect", "polars", "deltalake", "duckdb", "pyarrow"]
CHECK = ROOT / "infra" / "gpu" / "check.py"
SMALL = ["--device", "cpu", "--batch", "8", "--prompt-tokens", "8", "--new-tokens", "16", "--train-steps", "2"]


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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder of links to exactly those distributions' files: a GPU host's site-packages."""
    folder = tmp_path_factory.mktemp("gpu-host") / "site"
    folder.mkdir()
    for dist in installed_with(GPU_HOST):
        root = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, target = root / top, folder / top
            if source.exists() and not target.exists() and top != "..":
                target.symlink_to(source)
    assert not any((folder / name).exists() for name in PLATFORM_ONLY)  # the closure holds none of them
    return folder


def run_check(
    site,
    tmp_path,
    *args: str,
    script: Path = CHECK,
    fail: str = "",
    returncode: int = 0,
    ahead: Path | None = None,
    vllm_env: str = "",
):
    """check.py (or a script that runs it) in the bare Python, on the tiny shape: its parts by name, and its
    stdout and stderr. Every stdout line must be JSON. `ahead`: a folder of packages found before the site's."""
    path = f"{ahead}:{site}" if ahead else str(site)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": path,
        "RLVR_TORCH_THREADS": "1",
        "RLVR_GPU_CHECK_FAIL": fail,
        **({"VLLM_ENV": vllm_env} if vllm_env else {}),
    }
    result = subprocess.run(
        [sys.executable, "-S", str(script), "--shape", "tiny", *SMALL, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == returncode, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # JSON lines only, nothing else
    return {part["part"]: part for part in lines}, result


def test_the_gpu_check_needs_only_what_torch_and_transformers_install(site, tmp_path):
    parts, _ = run_check(site, tmp_path, "--processes", "2")
    assert parts["device"]["device"] == "cpu" and parts["sampling"]["generate_tokens_per_s"] > 0
    assert parts["hf_sampler"]["ratio_to_generate"] > 0  # the project's sampler imported without the stack
    assert parts["logprob_gap"]["ok"] and parts["logprob_gap"]["max_abs_gap"] < 1e-4
    assert parts["training"]["dtype"] == "bfloat16" and parts["training"]["tokens_per_s"] > 0
    parallel = parts["data_parallel"]
    assert parallel["processes"] == 2 and parallel["backend"] == "gloo" and parallel["ok"], parallel
    assert "no VLLM_ENV" in parts.pop("vllm_server")["skipped"]  # no vLLM on this host: said, not failed
    assert all(part["ok"] for part in parts.values()), parts


@pytest.mark.vllm
def test_the_gpu_check_runs_the_vllm_server_contract_where_vllm_is(site, tmp_path):
    """With VLLM_ENV the check starts serve.sh WEIGHTS=full on its model (here vLLM's CPU build, on the shape
    with the least head size it serves): sampled log-probs against the trainer's, a full-weight swap to other
    weights with every dev-mode answer checked, the version the workers report, and the gap after the swap
    (the model's embeddings are tied: an output layer left at the old weights would show)."""
    from policy.vllm_servers import VLLM_ENV, missing

    if missing():
        pytest.skip(missing())
    parts, _ = run_check(site, tmp_path, "--shape", "small", vllm_env=str(VLLM_ENV))
    served = parts["vllm_server"]
    assert served["ok"] and served["loaded"] == ["1"], served
    assert served["max_abs_gap"] < 1e-5 and served["max_abs_gap_after_swap"] < 1e-5 and served["swap_s"] > 0


OLDER_TRANSFORMERS = ROOT / "build" / "transformers-older"


@pytest.mark.skipif(
    not (OLDER_TRANSFORMERS / "transformers").exists(),
    reason="no transformers 5.17 in build/transformers-older: `make older-transformers` (CI makes it)",
)
def test_the_hf_sampler_runs_on_a_transformers_from_before_the_cache_rename(site, tmp_path):
    """The first run on a GPU host (H200, transformers 5.17) found the hf sampler reading `output.cache`, a
    name transformers took only in 5.24 (`past_key_values` before): sampling failed there. On 5.17 it now
    samples, and its behaviour log-probs agree with the trainer's recomputation."""
    parts, _ = run_check(site, tmp_path, ahead=OLDER_TRANSFORMERS)
    assert parts["device"]["transformers"] == "5.17.0"
    sampler = parts["hf_sampler"]
    assert sampler["ok"] and sampler["ratio_to_generate"] > 0 and sampler["max_abs_gap"] < 1e-4, sampler
    assert all(part.get("ok", True) for part in parts.values()), parts


FORGETFUL = """
    # check.py with a model whose forward drops the KV cache it is given (as a forward swallows a cache
    # passed under a name it does not know): each step then sees one token without its context.
    import functools, runpy, sys

    import transformers

    forward = transformers.Qwen2ForCausalLM.forward

    @functools.wraps(forward)
    def forgetful(self, *args, **kwargs):
        kwargs.pop("cache", None)
        kwargs.pop("past_key_values", None)
        return forward(self, *args, **kwargs)

    transformers.Qwen2ForCausalLM.forward = forgetful
    sys.argv[0] = CHECK
    runpy.run_path(CHECK, run_name="__main__")
"""


def test_a_sampler_that_loses_its_cache_fails_the_check(site, tmp_path):
    """The hf sampler's part compares its behaviour log-probs with the trainer's: a lost cache is a gap far
    past 1e-3, the part is not ok and the exit status is 1, though nothing raised."""
    script = tmp_path / "forgetful.py"
    script.write_text(f"CHECK = {str(CHECK)!r}\n" + textwrap.dedent(FORGETFUL))
    parts, _ = run_check(site, tmp_path, script=script, returncode=1)
    assert parts["hf_sampler"]["ok"] is False and parts["hf_sampler"]["max_abs_gap"] > 1e-2, parts["hf_sampler"]
    assert "error" not in parts["hf_sampler"] and parts["training"]["ok"]


NOISY = """
    # check.py with a model whose forward prints, warns and logs to stdout, and lacks transformers 5's
    # `logits_to_keep` (as transformers 4.x's Qwen2 forward does), which the project's sampler passes.
    import functools, inspect, logging, os, runpy, sys, warnings

    import transformers

    loud = logging.getLogger("noisy")
    loud.addHandler(logging.StreamHandler(sys.stdout))        # bound to stdout before check.py runs
    loud.propagate = False
    forward = transformers.Qwen2ForCausalLM.forward

    @functools.wraps(forward)
    def noisy(self, *args, **kwargs):
        print("a print from forward")
        warnings.warn("a warning from forward")
        loud.warning("a log record from forward")
        os.write(1, b"bytes on file descriptor 1 from forward\\n")
        if "logits_to_keep" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        return forward(self, *args, **kwargs)

    signature = inspect.signature(forward)
    noisy.__signature__ = signature.replace(parameters=[p for name, p in signature.parameters.items()
                                                        if name != "logits_to_keep"])
    transformers.Qwen2ForCausalLM.forward = noisy
    sys.argv[0] = CHECK
    runpy.run_path(CHECK, run_name="__main__")
"""


def test_stdout_is_json_lines_and_a_failing_part_does_not_stop_the_next(site, tmp_path):
    """Prints, warnings and log records in every part go to stderr; the project's sampler raises a
    TypeError (a transformers without `logits_to_keep`): its line says so, and the parts after it run. On
    the CPU without --processes, the data-parallel part's line says why it did not run."""
    script = tmp_path / "noisy.py"
    script.write_text(f"CHECK = {str(CHECK)!r}\n" + textwrap.dedent(NOISY))
    parts, result = run_check(site, tmp_path, script=script, returncode=1)
    for noise in [
        "a print from forward",
        "a warning from forward",
        "a log record from forward",
        "bytes on file descriptor 1",
        "Traceback (most recent call last)",
    ]:
        assert noise in result.stderr and noise not in result.stdout, noise
    sampler = parts["hf_sampler"]
    assert (
        sampler["ok"] is False and sampler["error"].startswith("TypeError: ") and "logits_to_keep" in sampler["error"]
    ), sampler
    assert isinstance(sampler["traceback"], list) and sampler["traceback"][-1].startswith("TypeError")
    assert parts["sampling"]["ok"] and parts["logprob_gap"]["ok"] and parts["training"]["tokens_per_s"] > 0
    assert "ok" not in parts["data_parallel"] and "--processes 2" in parts["data_parallel"]["skipped"]
    assert list(parts) == [
        "device",
        "model",
        "sampling",
        "hf_sampler",
        "logprob_gap",
        "training",
        "vllm_server",
        "data_parallel",
    ]


def test_the_parts_that_need_a_failed_part_say_they_were_skipped(site, tmp_path):
    """RLVR_GPU_CHECK_FAIL=sampling: sampling raises; the hf sampler (independent) still runs; the parts
    that need the sampled batch say they were skipped because sampling failed."""
    parts, _ = run_check(site, tmp_path, "--processes", "2", fail="sampling", returncode=1)
    assert parts["sampling"]["ok"] is False and parts["sampling"]["error"].startswith("RuntimeError: ")
    assert parts["hf_sampler"]["ok"] and parts["hf_sampler"]["ratio_to_generate"] is None
    for name in ["logprob_gap", "training", "data_parallel"]:
        assert parts[name]["ok"] is False and parts[name]["skipped"].startswith("part sampling failed"), parts[name]


def test_check_sh_keeps_stdout_and_stderr_apart_and_goes_on_after_a_failed_shape(tmp_path):
    """A shape check.py rejects (exit 2) does not stop the next; each shape gets a run line; summary.jsonl and
    stdout hold JSON lines only, the tracebacks and argparse's complaint are in stderr.log."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PY": sys.executable,
        "OUT": str(out),
        "SHAPES": "bogus tiny",
        "RLVR_TORCH_THREADS": "1",
        "RLVR_GPU_CHECK_FAIL": "hf_sampler",
    }
    result = subprocess.run(
        ["bash", str(ROOT / "infra" / "gpu" / "check.sh"), *SMALL, "--processes", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    summary = (out / "summary.jsonl").read_text()
    assert result.stdout == summary
    lines = [json.loads(line) for line in summary.splitlines()]
    runs = [line for line in lines if line["part"] == "run"]
    assert [(run["shape"], run["exit_code"], run["timed_out"]) for run in runs] == [
        ("bogus", 2, False),
        ("tiny", 1, False),
    ]
    parts = {line["part"]: line for line in lines}
    assert parts["hf_sampler"]["error"].startswith("RuntimeError: ") and parts["training"]["ok"]
    stderr = (out / "stderr.log").read_text()
    for text in ["invalid choice: 'bogus'", "Traceback (most recent call last)"]:
        assert text in stderr and text not in summary, text


def test_check_sh_records_a_shape_that_runs_out_of_time(tmp_path):
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    env = {**os.environ, "PY": str(slow), "OUT": str(tmp_path / "out"), "SHAPES": "tiny tiny", "TIMEOUT_S": "1"}
    result = subprocess.run(
        ["bash", str(ROOT / "infra" / "gpu" / "check.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    runs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(run["shape"], run["exit_code"], run["timed_out"], run["ok"]) for run in runs] == [
        ("tiny", 124, True, False)
    ] * 2
