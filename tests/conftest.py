"""Shared test fixtures: real servers on loopback (moto's S3, Prefect), lakes on disk and on S3."""

from __future__ import annotations

import atexit
import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"
BIN = Path(sys.executable).parent

# Prefect must never touch the user's ~/.prefect nor phone home; set before anything imports it.
_PREFECT_HOME = Path(tempfile.mkdtemp(prefix="rlvr-test-prefect-"))
os.environ["PREFECT_HOME"] = str(_PREFECT_HOME)
# Checkpoints downloaded from S3 lakes are cached here, not in the user's ~/.cache/rlvr.
os.environ["RLVR_CACHE"] = tempfile.mkdtemp(prefix="rlvr-test-cache-")
for _folder in (_PREFECT_HOME, os.environ["RLVR_CACHE"]):  # this process's own: removed when it ends
    atexit.register(shutil.rmtree, _folder, True)
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("RLVR_LAKE", None)

from policy.vllm_servers import free_port  # noqa: E402  (after the environment above; the tests' one)


def wait_for(url: str, process: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{what} did not answer at {url} within {timeout} s")


def stop_group(process: subprocess.Popen, signum: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Stop a process started with start_new_session=True and all it started: `signum`, then SIGKILL after `timeout`."""
    os.killpg(process.pid, signum)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server in its own process on loopback (in-process, delta-rs calls that hold the GIL would deadlock)."""
    from bench.moto import start_moto

    process, endpoint = start_moto()
    yield endpoint
    process.terminate()
    process.wait(10)


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    """AWS variables pointing at moto; a fresh bucket per test. Returns the bucket name."""
    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(name, value)
    from storage.location import s3_filesystem

    bucket = "rlvr-" + uuid.uuid4().hex[:12]
    s3_filesystem().mkdir(bucket)
    return bucket


@pytest.fixture(params=["local", "s3"])
def lake_uri(request, tmp_path) -> str:
    """The same test against a local folder and against S3 (moto) through delta-rs and s3fs."""
    if request.param == "local":
        return str(tmp_path / "lake")
    bucket = request.getfixturevalue("s3_env")
    return f"s3://{bucket}/lake"


@pytest.fixture
def lake(lake_uri):
    from storage.lake import Lake

    return Lake.open(lake_uri)


@pytest.fixture(scope="session")
def prefect_api():
    """A real `prefect server start` for the session; flows run in this process report to it."""
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="rlvr-test-prefect-server-"))
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_SERVER_TASKS_TAG_CONCURRENCY_SLOT_WAIT_SECONDS": "1",
    }  # tag-limit retries, tested
    process = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{port}/api"
    wait_for(api + "/health", process, 90, "prefect server")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}):
        yield api
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()  # send buffered run logs before the server goes away
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.exists():
        pytest.skip("../shared/datasets is not present")
    return SHARED_DATASETS


def run_cli(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    """`rlvr ARGS` in a fresh process, as a user would run it (flows in Prefect's temporary server)."""
    return subprocess.run(
        [str(BIN / "rlvr"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.fixture
def cli(prefect_api):
    """`run_cli` against the session's Prefect server: no temporary server per command (about 10 s each)."""

    def run(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
        return run_cli(*args, env={"PREFECT_API_URL": prefect_api, **(env or {})}, **kwargs)

    return run


def register_random_version(lake, version: int, seed: int) -> None:
    """Register another randomly initialised policy, shaped like version 0, as `version` (a stand-in for training)."""
    from transformers import AutoConfig

    from policy.checkpoints import load_policy, save_checkpoint
    from policy.tiny import TinyModelConfig, build_model
    from storage.registry import register, version_row

    base = version_row(lake, 0)["checkpoint_uri"]
    _, tokenizer = load_policy(base)
    shape = AutoConfig.from_pretrained(base) if not base.startswith("s3://") else load_policy(base)[0].config
    tiny = TinyModelConfig(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        seed=seed,
    )
    with lake.run("test", "register", {"seed": seed}) as run:
        uri = save_checkpoint(lake, version, build_model(tiny, tokenizer), tokenizer)
        register(lake, run, version, uri=uri, kind="test", parent=version - 1)


def register_sharpened_version(lake, version: int, bos: bool = False) -> None:
    """Version 0 with its (tied) output layer ×20, and optionally a tokenizer that adds a BOS, as Llama 3's does."""
    import torch

    from policy.checkpoints import load_policy, save_checkpoint
    from storage.registry import register, version_row

    model, tokenizer = load_policy(version_row(lake, 0)["checkpoint_uri"])
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    if bos:
        add_bos(tokenizer)
    with lake.run("test", "register", {"version": version}) as run:
        register(lake, run, version, uri=save_checkpoint(lake, version, model, tokenizer), kind="test", parent=0)


def add_bos(tokenizer) -> None:
    """Make the tokenizer add `<|im_start|>` as a BOS to every text it encodes with special tokens."""
    from tokenizers import processors

    from policy.tiny import IM_START

    bos_id = tokenizer.convert_tokens_to_ids(IM_START)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{IM_START} $A", pair=f"{IM_START} $A $B", special_tokens=[(IM_START, bos_id)]
    )
    tokenizer.bos_token = IM_START


def serve_policy(lake, *options: str):
    """`rlvr policy serve` over `lake` in its own process on a free port, once it answers: (process, base URL)."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "rlvr"), "policy", "serve", "--lake", lake.uri, "--port", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for(f"http://127.0.0.1:{port}/health", process, 60, "rlvr policy serve")
    return process, f"http://127.0.0.1:{port}"


def sharpened_base(folder: Path, factor: float = 4.0) -> str:
    """The default tiny policy with its (tied) output layer ×`factor` and a tokenizer that adds a BOS (as Llama
    3's does), saved as a plain checkpoint folder: a base whose next-token distribution is peaked like a
    trained model's, so that a penalty shows in the log-probs, and that every lake of a test can register as
    its version 0 (`BasePolicyConfig.checkpoint`)."""
    from transformers import AutoTokenizer

    from bench.engine_mismatch import sharpened_checkpoint

    path = sharpened_checkpoint(folder, folder.parent / f"{folder.name}-scratch", factor)
    tokenizer = AutoTokenizer.from_pretrained(path)
    add_bos(tokenizer)
    tokenizer.save_pretrained(path)
    return path


def register_adapter_version(lake, version: int, seed: int, rank: int = 4) -> None:
    """A LoRA adapter on version 0 (q and v projections) whose B matrices are random (a fresh adapter changes
    nothing), registered as `version`: what `train.lora` publishes, with a visible effect on the log-probs."""
    from bench.publish_time import random_adapter
    from policy.checkpoints import save_checkpoint
    from storage.registry import register, version_row

    base = version_row(lake, 0)["checkpoint_uri"]
    adapted, tokenizer = random_adapter(base, rank, ["q_proj", "v_proj"], seed, scale=0.5)
    with lake.run("test", "register", {"version": version}) as run:
        register(
            lake,
            run,
            version,
            uri=save_checkpoint(lake, version, adapted, tokenizer, adapter_of=base),
            kind="test",
            parent=0,
        )


def penalised_copy(folder: str, target: Path, repetition_penalty: float = 1.3) -> str:
    """A copy of a checkpoint whose generation_config.json sets a repetition penalty (as Qwen2.5-Instruct's
    sets 1.1): what a server started without `--generation-config vllm` applies to requests that omit it."""
    import json

    shutil.copytree(folder, target, dirs_exist_ok=True)
    config = target / "generation_config.json"
    stated = json.loads(config.read_text()) if config.exists() else {}
    config.write_text(json.dumps({**stated, "repetition_penalty": repetition_penalty}))
    return str(target)


def contract_lake(folder: Path):
    """The lake the server-contract tests share, for the stand-in and for vLLM alike: v0 `sharpened_base`,
    v1 another random policy of its shape (every weight differs, the tied embedding too), v2 and v3 LoRA
    adapters on v0. Returns (lake, base folder, penalised copy of the base)."""
    from storage.lake import Lake
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

    base = sharpened_base(folder / "base")
    lake = Lake.open(str(folder / "lake"))
    ensure_base_policy(lake, BasePolicyConfig(checkpoint=base))
    register_random_version(lake, 1, seed=11)
    register_adapter_version(lake, 2, seed=2)
    register_adapter_version(lake, 3, seed=3)
    return lake, base, penalised_copy(base, folder / "penalised")


@dataclass
class Servers:
    """One engine's servers over `contract_lake`: `full`, one-name servers holding v0 whose weights are swapped
    in place (serve.sh WEIGHTS=full, dev mode); `lora`, a server of adapters by name on the penalised copy of
    v0, which applies its generation config's repetition penalty to what a request omits."""

    engine: str  # stand-in (rlvr policy serve) or vllm
    lake: object
    base: str  # the base checkpoint folder every server started from
    full: list[str]
    lora: str
    lora_rotation: list[str]  # `lora` and an adapter server as serve.sh starts it by default, for a rotation


@pytest.fixture(scope="session")
def vllm(tmp_path_factory):
    """Real vLLM servers, started once per test run, concurrently: two WEIGHTS=full, two of adapters (five cost
    the run half a minute more on two cores). Skipped, naming `make vllm-server`, without `.venv-vllm`."""
    from policy import vllm_servers

    reason = vllm_servers.missing()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("vllm")
    lake, base, penalised = contract_lake(folder)
    logs = folder / "logs"
    servers = [vllm_servers.start(base, logs, free_port(), WEIGHTS="full") for _ in range(2)]
    servers.append(
        vllm_servers.start(penalised, logs, free_port(), WEIGHTS="adapter", GENERATION_CONFIG="auto", MAX_LORAS="2")
    )
    servers.append(vllm_servers.start(base, logs, free_port(), WEIGHTS="adapter"))
    try:
        vllm_servers.wait_until_serving(servers)
        yield Servers("vllm", lake, base, [s.url for s in servers[:2]], servers[2].url, [s.url for s in servers[2:]])
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory):
    """The same servers as `vllm`, from `rlvr policy serve`."""
    folder = tmp_path_factory.mktemp("stand-in")
    lake, base, penalised = contract_lake(folder)
    started = [serve_policy(lake, "--served-model-name", "policy", "--dev-mode") for _ in range(2)]
    started.append(serve_policy(lake, "--no-on-demand", "--preload", "0", "--generation-config", penalised))
    started.append(serve_policy(lake, "--no-on-demand", "--preload", "0"))
    try:
        yield Servers(
            "stand-in", lake, base, [url for _, url in started[:2]], started[2][1], [url for _, url in started[2:]]
        )
    finally:
        for process, _ in started:
            process.terminate()
            process.wait(10)


@pytest.fixture(params=["stand-in", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request) -> Servers:
    """Each server-contract test runs against both engines: `make test` the stand-in, `make test-vllm` vLLM."""
    return request.getfixturevalue("vllm" if request.param == "vllm" else "stand_in")


# What starts a process: the fixtures that hold a server or run the command line, and calls in a test's own body.
PROCESS_FIXTURES = {"prefect_api", "cli", "s3_endpoint", "vllm", "stand_in", "engine"}
PROCESS_CALLS = re.compile(r"\b(run_cli|serve_policy|subprocess\.|Popen\(|multiprocessing\.|mp\.spawn)")


def pytest_collection_modifyitems(config, items):
    """Mark each test `prefect` (it uses the session's Prefect server) and `subprocess` (it starts a process of its
    own, or asks for a fixture that does), so either group can be run or left out with `-m`."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "prefect_api" in fixtures:
            item.add_marker(pytest.mark.prefect)
        function = getattr(item, "function", None)
        try:
            body = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            body = ""
        s3 = getattr(item, "callspec", None) is not None and item.callspec.params.get("lake_uri") == "s3"
        if fixtures & PROCESS_FIXTURES or s3 or PROCESS_CALLS.search(body):
            item.add_marker(pytest.mark.subprocess)
