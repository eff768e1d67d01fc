"""Deployments against a real Prefect server: `rlvr serve` registers cron schedules and runs a triggered
flow run; the generated prefect.yaml deploys the same flows to a work pool that a worker runs."""

import os
import signal
import subprocess
import time
from pathlib import Path

import yaml
from conftest import BIN, ROOT, run_cli, stop_group

TINY_BANK = {"sources": [{"kind": "generator", "generator": "mix", "count": 20, "seed": 0}]}


def wait_for_state(client, flow_run_id, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.read_flow_run(flow_run_id).state
        if state is not None and state.is_final():
            return state
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} did not finish in {timeout} s (last state {state})")


def deployments_by_name(client, names: set[str], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {d.name: d for d in client.read_deployments() if d.name in names}
        if set(found) == names:
            return found
        time.sleep(1)
    raise AssertionError(f"deployments {sorted(names)} were not registered in {timeout} s")


def test_rlvr_serve_registers_schedules_and_runs_a_triggered_flow(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    lake = tmp_path / "lake"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"bank": TINY_BANK}))
    (tmp_path / "deployments.yaml").write_text(
        yaml.safe_dump(
            {
                "lake": str(lake),
                "run_config": "run.yaml",
                "report_dir": str(tmp_path / "report"),
                "deployments": [
                    {"name": "serve-nightly", "flow": "curate", "cron": "0 2 * * *"},
                    {"name": "serve-latest", "flow": "evaluate", "cron": "15 * * * *"},
                    {"name": "serve-rescore", "flow": "rescore"},
                ],
            }
        )
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = subprocess.Popen(
        [str(BIN / "rlvr"), "serve", "--config", str(tmp_path / "deployments.yaml")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with get_client(sync_client=True) as client:
            found = deployments_by_name(client, {"serve-nightly", "serve-latest", "serve-rescore"})
            crons = {name: [s.schedule.cron for s in d.schedules] for name, d in found.items()}
            assert crons == {"serve-nightly": ["0 2 * * *"], "serve-latest": ["15 * * * *"], "serve-rescore": []}
            assert found["serve-nightly"].parameters == {"lake_uri": str(lake), "config": TINY_BANK}
            assert client.read_flow(found["serve-latest"].flow_id).name == "evaluate-model"
            run = client.create_flow_run_from_deployment(found["serve-nightly"].id)
            state = wait_for_state(client, run.id)
            assert state.is_completed(), state
    finally:
        stop_group(server, signal.SIGINT, 30)
    from storage.lake import Lake

    problems = Lake.open(str(lake)).read("problems")
    assert problems.height > 0 and problems["bank_version"].unique().to_list() == [1]


def test_serve_refuses_a_temporary_server_and_bad_schedules(tmp_path):
    env = {"PREFECT_API_URL": ""}
    result = run_cli("serve", "--config", str(ROOT / "configs" / "deployments.yaml"), env=env)
    assert result.returncode == 2 and "prefect server start" in result.stderr
    (tmp_path / "bad.yaml").write_text("deployments:\n  - {name: x, flow: curate, cron: '61 * * * *'}\n")
    result = run_cli("serve", "--config", str(tmp_path / "bad.yaml"), env=env)
    assert result.returncode == 2 and "bad.yaml:2: deployments.0.cron" in result.stderr  # its YAML line


def test_the_committed_prefect_yaml_is_generated_from_the_deployments_file(tmp_path):
    result = run_cli("serve", "--write-prefect-yaml", str(tmp_path / "prefect.yaml"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "prefect.yaml").read_text().split("\n", 1)[1] == (ROOT / "prefect.yaml").read_text().split(
        "\n", 1
    )[1], "regenerate prefect.yaml (see its first line)"


def test_prefect_deploy_registers_the_yaml_and_a_worker_runs_it(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    env = {"PREFECT_API_URL": prefect_api, "RLVR_HOME": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    prefect = lambda *args, timeout=180: subprocess.run(  # noqa: E731
        [str(BIN / "prefect"), "--no-prompt", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    created = prefect("work-pool", "create", "rlvr", "--type", "process")
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect("deploy", "--all")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    names = {d["name"] for d in spec["deployments"]}
    with get_client(sync_client=True) as client:
        found = deployments_by_name(client, names)
        for entry in spec["deployments"]:
            assert [s.schedule.cron for s in found[entry["name"]].schedules] == [s["cron"] for s in entry["schedules"]]
            assert found[entry["name"]].work_pool_name == "rlvr"
            client.pause_deployment(found[entry["name"]].id)  # no scheduled run may reach the worker below
        lake = tmp_path / "lake"
        run = client.create_flow_run_from_deployment(
            found["nightly"].id, parameters={"lake_uri": str(lake), "config": TINY_BANK}
        )
        worker = prefect("worker", "start", "--pool", "rlvr", "--run-once", timeout=300)
        assert worker.returncode == 0, worker.stdout[-2000:] + worker.stderr[-2000:]
        assert wait_for_state(client, run.id, 30).is_completed()
    assert Path(lake / "problems").exists()
