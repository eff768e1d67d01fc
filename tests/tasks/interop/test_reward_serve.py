"""`rlvr reward serve` over real HTTP: OpenRLHF's request shape answered with the platform's verdicts, concurrent
requests gathered into group commits, every acknowledged reward in the lake under the trainer's run (problems
traced back to the bank, an external model version per step, groups with solve rates), a killed server losing
none of them, and the iterations re-scored with `rlvr stage verify`."""

import http.client
import inspect
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import run_cli

from bench.reward_serve import start_server
from flows.cli.interop import reward_serve
from flows.curation import curate_bank
from storage.lake import Lake
from tasks.interop.reward_http import DEFAULT_MAX_REQUEST_MB

TEMPLATE = "<|user|>\n{}\n<|assistant|>\n"  # what OpenRLHF's chat template puts round the statement


def post(url: str, body: dict | None, timeout: float = 60, headers: dict | None = None) -> tuple[int, dict]:
    """POST `body` as JSON (None: a GET); the status and the JSON answer, an error's too."""
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def bank(tmp_path):
    """A lake with a curated bank, and its OpenRLHF export (prompt under `input`, ground truth under `label`)."""
    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": 30, "seed": 0}]}, lake_uri)
    exported = tmp_path / "train.jsonl"
    assert run_cli("export", "--to", "openrlhf", "--out", str(exported), "--lake", lake_uri).returncode == 0
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    return lake_uri, [row for row in rows if row["domain"] == "math"]


def stop(server: subprocess.Popen, sig=signal.SIGINT) -> None:
    if server.poll() is None:
        os.killpg(server.pid, sig)
        server.wait(30)


def openrlhf_request(row: dict, response: str) -> dict:
    prompt = TEMPLATE.format(row["input"])
    return {"query": [prompt + response + "<|end|>"], "prompts": [prompt], "labels": [row["label"]]}


def test_openrlhf_requests_are_scored_group_committed_and_recorded(bank):
    lake_uri, rows = bank
    rows = rows[:6]
    server, url = start_server(
        lake_uri, "--run", "orl-1", "--model", "qwen-tiny", "--rollouts-per-step", "8", "--workers", "0"
    )
    try:
        assert post(url + "/get_reward", {"query": [], "prompts": [], "labels": []}) == (
            200,
            {"rewards": [], "scores": [], "extra_logs": {}},
        )  # OpenRLHF's extra URLs send nothing
        status, answer = post(url + "/get_reward", {"query": ["a"], "prompts": ["a", "b"], "labels": ["1"]})
        assert status == 400 and "one entry each per sample" in answer["error"]
        # 6 problems × 4 samples, one request per sample as OpenRLHF sends them, 12 at a time
        requests = [
            (row, f"so #### {row['label'] if sample % 2 == 0 else 'nope'}") for row in rows for sample in range(4)
        ]
        answers = [None] * len(requests)

        def send(index: int) -> None:
            answers[index] = post(url + "/get_reward", openrlhf_request(*requests[index]))

        for start in range(0, len(requests), 12):
            threads = [threading.Thread(target=send, args=(i,)) for i in range(start, min(start + 12, len(requests)))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        for (row, response), (status, answer) in zip(requests, answers):
            assert status == 200, answer
            expected = 1.0 if response.endswith(row["label"]) else 0.0
            assert answer["rewards"] == [expected] and answer["scores"] == [expected]
            assert answer["extra_logs"] == {"correct": [expected]}
    finally:
        stop(server)
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts")
    assert rollouts.height == 24 and set(rollouts["backend"]) == {"openrlhf"}
    assert rollouts["rollout_id"].is_unique().all()
    numbered = rollouts.group_by("iteration", "problem_id").agg(pl.col("sample_idx").sort())
    assert all(samples == list(range(len(samples))) for samples in numbered["sample_idx"].to_list())
    assert set(rollouts["problem_id"]) == {row["problem_id"] for row in rows}  # traced back to the bank
    assert sorted(rollouts["iteration"].value_counts()["count"]) == [8, 8, 8]  # 8 rollouts a step
    runs = lake.read("runs", filter=pc.field("flow") == "external:orl-1")
    assert set(runs["status"]) == {"completed"} and set(runs["stage"]) == {"reward"}
    assert runs.height < 24  # group commits
    rewards = lake.read("rewards")
    assert rewards.height == 24 and rewards["correct"].sum() == 12
    assert rewards.join(rollouts, on=["rollout_id", "run_id"]).height == 24
    versions = lake.read("model_versions").sort("model_version")
    assert versions["kind"].to_list() == ["external"] * 3 and set(versions["served_name"]) == {"qwen-tiny"}
    assert versions["parent_version"].to_list() == [None, 0, 1] and versions["iteration"].to_list() == [0, 1, 2]
    groups = lake.read("groups")
    assert groups["n_samples"].sum() == 24
    per_problem = groups.group_by("problem_id").agg(pl.col("n_samples").sum())
    assert set(per_problem["n_samples"]) == {4}

    # the platform's SQL and re-scoring on a run it did not drive
    sql = run_cli(
        "sql",
        "--lake",
        lake_uri,
        "--format",
        "json",
        "select o.problem_id, avg(case when r.correct then 1.0 else 0.0 end) as solve_rate "
        "from rollouts o join rewards r using (rollout_id) join runs u on o.run_id = u.run_id "
        "where u.flow = 'external:orl-1' group by 1",
    )
    assert sql.returncode == 0, sql.stderr
    solve_rates = [json.loads(line) for line in sql.stdout.splitlines() if line.strip()]
    assert len(solve_rates) == 6 and {row["solve_rate"] for row in solve_rates} == {0.5}
    rescored = run_cli("stage", "verify", "--iteration", "0", "--verifier", "exact", "--lake", lake_uri)
    assert rescored.returncode == 0, rescored.stderr + rescored.stdout
    exact = lake.read("rewards", filter=(pc.field("iteration") == 0) & (pc.field("verifier") == "exact"))
    assert exact.height == 8
    lineage = run_cli("lineage", "model-version", "2", "--lake", lake_uri)
    assert lineage.returncode == 0 and "external, parent 1, iteration 2" in lineage.stdout


def test_native_endpoint_code_in_the_sandbox_and_clear_errors(bank, tmp_path):
    lake_uri, rows = bank
    server, url = start_server(lake_uri, "--run", "default-run", "--workers", "1")
    try:
        add = json.dumps({"tests": "assert add(2, 3) == 5", "entry_point": "add"})
        items = [
            {
                "prompt": "Write add(a, b).",
                "response": "```python\ndef add(a, b):\n    return a + b\n```",
                "label": add,
                "domain": "code",
            },
            {
                "prompt": "Write add(a, b).",
                "response": "```python\nimport os\nos._exit(0)\n```",
                "label": add,
                "domain": "code",
            },
            {"prompt": "", "response": f"#### {rows[0]['label']}", "problem_id": rows[0]["problem_id"]},
        ]
        status, answer = post(url + "/v1/rewards", {"run": "native-1", "step": 3, "model": "m", "items": items})
        assert status == 200, answer
        assert answer["rewards"] == [1.0, 0.0, 1.0] and answer["iteration"] == 3 and answer["lake_run_id"]
        assert answer["verifiers"][0] == "code"
        for body, field in [
            ({"step": -1, "items": []}, "`step`"),
            ({"step": 0, "items": [{"prompt": "p"}]}, "items[0]"),
            ({"step": 0, "items": [{"prompt": "p", "response": "r"}]}, "`label`"),
            (
                {"step": 0, "items": [{"prompt": "p", "response": "r", "label": "1", "response_token_ids": ["a"]}]},
                "`response_token_ids`",
            ),
            (
                {"step": 0, "items": [{"prompt": "p", "response": "r", "problem_id": "nope"}]},
                "not in the bank and the item has no label",
            ),
            (
                {"run": "bad name!", "step": 0, "items": [{"prompt": "p", "response": "r", "label": "1"}]},
                "run name 'bad name!'",
            ),
        ]:
            status, answer = post(url + "/v1/rewards", body)
            assert status == 400 and field in answer["error"]
    finally:
        stop(server)
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts", filter=pc.field("iteration") == 3)
    assert rollouts.height == 3 and rollouts["problem_id"][2] == rows[0]["problem_id"]
    assert rollouts["problem_id"][0].startswith("ext-")
    assert lake.read("runs", filter=pc.field("flow") == "external:native-1")["status"].to_list() == ["completed"]


def test_a_killed_server_loses_no_acknowledged_reward_and_iterations_stay_with_their_run(bank):
    """SIGKILL while requests are in flight: every reward answered is in the lake, and nothing is there twice."""
    lake_uri, rows = bank
    server, url = start_server(lake_uri, "--run", "crashy", "--workers", "0")
    answered, lock = [], threading.Lock()

    def send(row: dict) -> None:
        for _ in range(6):
            try:
                status, _ = post(url + "/get_reward", openrlhf_request(row, f"#### {row['label']}"), timeout=30)
            except (OSError, http.client.HTTPException, ValueError):  # the server died under this request (refused,
                return  # reset, or its answer cut short): not acknowledged
            if status == 200:
                with lock:
                    answered.append(row["problem_id"])

    threads = [threading.Thread(target=send, args=(row,)) for row in rows[:12]]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(answered) < 12 and time.monotonic() < deadline:  # some answered, more in flight
        time.sleep(0.01)
    stop(server, signal.SIGKILL)
    for thread in threads:
        thread.join()
    assert 12 <= len(answered) < 72, len(answered)  # killed mid-way
    lake = Lake.open(lake_uri)
    stored = lake.read("rollouts")
    assert stored["rollout_id"].is_unique().all()
    held = Counter(stored["problem_id"].to_list())
    assert all(held[problem_id] >= count for problem_id, count in Counter(answered).items())  # every answered one
    assert lake.read("rewards").height == stored.height and set(lake.read("rewards")["reward"]) == {1.0}

    other, url = start_server(lake_uri, "--run", "another", "--workers", "0")
    try:
        status, answer = post(url + "/get_reward", openrlhf_request(rows[0], "#### 1"))
        assert status == 400 and "holds rollouts of external:crashy" in answer["error"]
    finally:
        stop(other)
    assert lake.read("rollouts").height == stored.height


def test_the_reward_serve_benchmark_runs_and_finds_every_acknowledged_row():
    """`rlvr bench reward-serve` at a laptop's size, so that it cannot rot (its figures are not checked here)."""
    from bench.reward_serve import run_benchmark

    figures = run_benchmark(problems=4, samples=2, clients=4, batch=4, workers=0)
    assert figures["rows_in_lake"] == figures["rows_acknowledged"] == 2 * 8 + 1
    assert figures["agreement_with_in_process"] == 1.0 and figures["group_commits"] >= 1


def test_a_guarded_server_refuses_foreign_prompts_big_bodies_strangers_and_other_runs(bank, tmp_path):
    """`--token-file`, `--max-request-mb` and `--allow-run` over HTTP, and a query that does not hold its prompt
    (whose example answer the old server scored as the response's); nothing refused reaches the lake."""
    lake_uri, rows = bank
    row = rows[0]
    (tmp_path / "token").write_text("s3cret-Token_1\n")
    server, url = start_server(
        lake_uri,
        "--run",
        "orl-g",
        "--workers",
        "0",
        "--token-file",
        str(tmp_path / "token"),
        "--max-request-mb",
        "1",
        "--allow-run",
        "native-ok",
    )
    auth = {"Authorization": "Bearer s3cret-Token_1"}
    try:
        assert post(url + "/health", None) == (200, {"status": "ok", "bank_problems": 30})  # open to all
        request = openrlhf_request(row, f"#### {row['label']}")
        status, answer = post(url + "/get_reward", request)
        assert status == 401 and answer["error"].startswith("no bearer token: send the header `Authorization:")
        status, answer = post(url + "/get_reward", request, headers={"Authorization": "Bearer s3cret-Token_2"})
        assert status == 401 and answer["error"].startswith("wrong bearer token")
        assert post(url + "/nowhere", None)[0] == 401  # no route is told to a stranger
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "/v1/rewards", data=b"{}")
        assert refused.value.headers["WWW-Authenticate"] == 'Bearer realm="rlvr reward serve"'

        prompt = TEMPLATE.format(f"The answer goes last, as in \\boxed{{{row['label']}}}.\n{row['input']}")
        foreign = prompt.replace("<|user|>\n", "<|user|>\n ") + "I cannot say.<|end|>"  # its prompt altered
        status, answer = post(
            url + "/get_reward",
            {
                "query": [prompt + f"#### {row['label']}", foreign],
                "prompts": [prompt, prompt],
                "labels": [row["label"]] * 2,
            },
            headers=auth,
        )
        assert status == 400, answer
        assert answer["error"].startswith(
            "query[1] does not start with prompts[1] (only special tokens such as "
            "padding may lead it): they part at character 9, where the query has "
            "' The answer"
        )
        padded = "<|endoftext|><|endoftext|>" + prompt + f"#### {row['label']}<|im_end|>"  # a padded batch's
        assert post(
            url + "/get_reward", {"query": [padded], "prompts": [prompt], "labels": [row["label"]]}, headers=auth
        ) == (200, {"rewards": [1.0], "scores": [1.0], "extra_logs": {"correct": [1.0]}})

        status, answer = post(
            url + "/get_reward", {"query": ["x" * (1 << 20)], "prompts": ["x"], "labels": ["1"]}, headers=auth
        )
        assert status == 413 and "over this server's limit of 1,048,576 (--max-request-mb)" in answer["error"]

        native = {"step": 3, "model": "m", "items": [{"prompt": "What is 1 + 1?", "response": "#### 2", "label": "2"}]}
        status, answer = post(url + "/v1/rewards", {"run": "native-other", **native}, headers=auth)
        assert (status, answer["error"]) == (
            403,
            "run 'native-other' is not one this server may write: native-ok, orl-g (its --run and --allow-run)",
        )
        status, answer = post(url + "/v1/rewards", {"run": "native-ok", **native}, headers=auth)
        assert status == 200 and answer["rewards"] == [1.0] and answer["iteration"] == 3
    finally:
        stop(server)
    stored = Lake.open(lake_uri).read("rollouts").sort("iteration")
    assert stored.select("iteration", "response").rows() == [(0, f"#### {row['label']}"), (3, "#### 2")]
    assert inspect.signature(reward_serve).parameters["max_request_mb"].default == DEFAULT_MAX_REQUEST_MB


def test_a_token_file_missing_or_empty_and_a_bad_allowed_run_stop_the_server_at_start(tmp_path):
    lake = str(tmp_path / "lake")
    (tmp_path / "empty").write_text("\n")
    for options, expected in [
        (["--token-file", str(tmp_path / "absent")], f"--token-file {tmp_path}/absent: no such file"),
        (["--token-file", str(tmp_path / "empty")], f"--token-file {tmp_path}/empty is empty"),
        (["--allow-run", "bad name"], "--allow-run 'bad name' is not a run name"),
    ]:
        started = run_cli("reward", "serve", "--run", "r", "--lake", lake, "--port", "0", *options, timeout=120)
        assert started.returncode == 1 and expected in " ".join(started.stderr.split()), started.stderr


def test_a_restarted_server_numbers_openrlhf_steps_on_from_the_stored_rollouts(bank):
    """What docs/trainers.md says of a restart: the k-th rollout stored for the run is in step k // 4, live and
    after a restart alike (a refused request takes no number); a new run with an offset starts past the old one;
    a step the native route repeats gains rows."""
    lake_uri, rows = bank
    options = ("--run", "orl-r", "--rollouts-per-step", "4", "--workers", "0")
    server, url = start_server(lake_uri, *options)
    try:
        for row in rows[:6]:
            assert post(url + "/get_reward", openrlhf_request(row, f"#### {row['label']}"))[0] == 200
        assert post(url + "/get_reward", {"query": ["elsewhere"], "prompts": ["p"], "labels": ["1"]})[0] == 400
    finally:
        stop(server)
    server, url = start_server(lake_uri, *options)  # OpenRLHF resumed from a checkpoint: its steps come again
    try:
        for row in rows[:3]:
            assert post(url + "/get_reward", openrlhf_request(row, f"#### {row['label']}"))[0] == 200
        for response in ("#### 2", "#### 3"):
            status, answer = post(
                url + "/v1/rewards",
                {
                    "run": "native-r",
                    "step": 7,
                    "model": "m",
                    "items": [{"prompt": "What is 1 + 1?", "response": response, "label": "2"}],
                },
            )
            assert status == 200 and answer["iteration"] == 7
    finally:
        stop(server)
    # OpenRLHF restarted from its checkpoint: a new run past the old one's iterations (docs/trainers.md)
    server, url = start_server(lake_uri, "--run", "orl-r2", "--iteration-offset", "3", *options[2:])
    try:
        assert post(url + "/get_reward", openrlhf_request(rows[3], f"#### {rows[3]['label']}"))[0] == 200
    finally:
        stop(server)
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts").sort("created_at", "rollout_id")
    assert rollouts.filter(pl.col("iteration") == 3)["problem_id"].to_list() == [rows[3]["problem_id"]]
    openrlhf = rollouts.filter(pl.col("iteration") < 3)
    ids = [row["problem_id"] for row in rows]
    assert openrlhf.select("iteration", "problem_id").rows() == [(0, i) for i in ids[:4]] + [
        (1, i) for i in ids[4:6] + ids[:2]
    ] + [(2, ids[2])]
    assert openrlhf.group_by("iteration").agg(pl.col("model_version").n_unique())["model_version"].to_list() == [1] * 3
    repeated = rollouts.filter(pl.col("iteration") == 7)
    assert repeated["sample_idx"].to_list() == [0, 1] and repeated["model_version"].n_unique() == 1
    groups = lake.read("groups", filter=pc.field("iteration") == 7)
    assert groups.select("n_samples", "mean_reward", "solve_rate").rows() == [(2, 0.5, 0.5)]


def test_a_failed_commit_takes_no_step_number(tmp_path):
    """OpenRLHF retries a request answered 500: its responses are numbered when they are stored, so the retry
    lands where the failed request would have (2 rollouts a step: the two stored ones are both step 0)."""
    from tasks.interop.reward_service import RewardService

    service = RewardService(Lake.open(str(tmp_path / "lake")), "orl", rollouts_per_step=2, commit_interval=0).start()
    try:
        recorder = service._external("orl")
        record = recorder.record
        recorder.record = lambda *args: (_ for _ in ()).throw(OSError("disk full"))
        request = {"query": ["p #### 2<|end|>"], "prompts": ["p "], "labels": ["2"]}
        with pytest.raises(RuntimeError, match="disk full"):
            service.openrlhf(request)
        recorder.record = record
        assert [service.openrlhf(request)["rewards"] for _ in range(2)] == [[1.0], [1.0]]
    finally:
        service.close()
    assert service.lake.read("rollouts")["iteration"].to_list() == [0, 0]
