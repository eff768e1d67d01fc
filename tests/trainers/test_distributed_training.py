"""Training past one process: persistent ranks on torch.distributed (gloo on these CPUs), DDP and FSDP2.

Two ranks must train exactly as one process does on the same batch (loss, gradient norm, weights), stay up
between steps with the model and optimizer in memory (the second step reloads nothing and still equals one
process that reloads the optimizer state from the checkpoint), write a checkpoint transformers loads, and
fail a step whose rank is killed, naming the rank, with nothing registered."""

import os
import signal
import time

import pytest
import torch
from helpers import CONFIG, curated


@pytest.fixture(autouse=True)
def no_groups_left():
    """Each test's ranks stop with it (another test's would hold this one's cores)."""
    from trainers.workers import GROUPS

    yield
    for group in list(GROUPS.values()):
        group.close()


@pytest.fixture
def sampled(prefect_api, tmp_path):
    """A lake with iteration 1 sampled, scored and batched from version 0."""
    from flows.iteration import rl_iteration

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    return lake_uri


def weights(lake_uri: str, version: int) -> dict:
    from policy.checkpoints import load_policy
    from storage.lake import Lake
    from storage.registry import version_row

    return load_policy(version_row(Lake.open(lake_uri), version)["checkpoint_uri"])[0].state_dict()


def assert_same_step(one: dict, two: dict) -> None:
    assert two["processes"] == 2 and one["processes"] == 1 and two["sequences"] == one["sequences"]
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6) and two["tokens"] == one["tokens"]
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert two["clip_fraction"] == pytest.approx(one["clip_fraction"], abs=1e-6)


def test_fsdp_ranks_train_as_one_process_and_write_a_checkpoint_transformers_loads(sampled):
    from transformers import AutoModelForCausalLM

    from flows.iteration import train_policy
    from storage.lake import Lake
    from storage.registry import version_row

    one = train_policy(1, {"micro_batch_size": 5}, sampled)
    sharded = train_policy(1, {"micro_batch_size": 5, "processes": 2, "strategy": "fsdp"}, sampled, parent=0)
    assert_same_step(one, sharded)
    single, fsdp = weights(sampled, 1), weights(sampled, 2)
    assert single.keys() == fsdp.keys()
    for name in single:
        assert torch.allclose(single[name], fsdp[name], atol=1e-6), name
    folder = version_row(Lake.open(sampled), 2)["checkpoint_uri"]
    loaded = AutoModelForCausalLM.from_pretrained(folder)  # a plain checkpoint, no shards
    assert torch.equal(loaded.state_dict()["model.norm.weight"], fsdp["model.norm.weight"])
    state = torch.load(os.path.join(folder, "training_state.pt"), weights_only=True)
    assert state["step"] == 1 and len(state["optimizer"]["state"]) == len(list(loaded.parameters()))


@pytest.mark.slow  # a sampled iteration, then two trainings on ranks
def test_the_decoupled_proximal_pass_runs_on_fsdp_ranks_as_in_one_process(sampled):
    """Two optimizer steps a batch with the decoupled objective: π_prox is a no-grad pass before the first update,
    a forward per micro-batch on every rank (FSDP's forwards are collectives: idle ones keep them in step)."""
    from flows.iteration import train_policy

    settings = {"micro_batch_size": 5, "mini_batches": 2, "off_policy_loss": "decoupled", "learning_rate": 0.01}
    one = train_policy(1, settings, sampled)
    sharded = train_policy(1, {**settings, "processes": 2, "strategy": "fsdp"}, sampled, parent=0)
    assert one["optimizer_steps"] == 2 and one["clip_fraction"] > 0
    assert_same_step(one, sharded)


def test_ranks_stay_up_between_steps_with_the_model_and_optimizer_in_memory(sampled):
    from flows.iteration import rl_iteration, train_policy
    from trainers.workers import GROUPS

    ddp = {"micro_batch_size": 5, "processes": 2, "strategy": "ddp"}
    first = train_policy(1, ddp, sampled)
    [group] = GROUPS.values()
    pids = group.pids
    rl_iteration(CONFIG, iteration=2, lake_uri=sampled)  # sampled from version 1
    second = train_policy(2, ddp, sampled)
    assert group.pids == pids and all(process.is_alive() for process in group.processes)  # no process start
    assert (first["global_step"], second["global_step"]) == (1, 2)
    assert group.held_uri.endswith("v00002")

    # one process over the same two steps (it reloads each parent and its optimizer state from the checkpoint)
    alone = train_policy(1, {"micro_batch_size": 5}, sampled, parent=0)
    again = train_policy(2, {"micro_batch_size": 5}, sampled, parent=alone["model_version"])
    assert_same_step(again, second)
    kept, reloaded = weights(sampled, 2), weights(sampled, again["model_version"])
    for name in kept:
        assert torch.allclose(kept[name], reloaded[name], atol=1e-6), name


def test_a_killed_rank_fails_the_step_naming_it_and_the_next_step_starts_anew(sampled, tmp_path, monkeypatch):
    from flows.iteration import train_policy
    from storage.lake import Lake
    from trainers.grpo import TrainConfig
    from trainers.workers import RankFailed, trainer_group

    hold = tmp_path / "hold"
    monkeypatch.setenv("RLVR_FAULT", "rank-ready:1")  # rank 1 waits there, mid-step
    monkeypatch.setenv("RLVR_FAULT_HOLD", str(hold))
    ddp = {"micro_batch_size": 5, "processes": 2, "strategy": "ddp"}
    group = trainer_group(TrainConfig.model_validate(ddp))  # started with the fault in its environment

    def kill_rank_one_when_it_waits():
        deadline = time.monotonic() + 120
        while not (tmp_path / "hold.reached").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(group.pids[1], signal.SIGKILL)  # kill -9, from outside

    import threading

    killer = threading.Thread(target=kill_rank_one_when_it_waits)
    killer.start()
    with pytest.raises(Exception) as failed:
        train_policy(1, ddp, sampled)
    killer.join()
    assert isinstance(failed.value, RankFailed) or "RankFailed" in str(failed.value)
    assert "trainer rank 1 of 2" in str(failed.value) and "SIGKILL" in str(failed.value)
    assert not any(process.is_alive() for process in group.processes)  # rank 0 was stopped too
    assert Lake.open(sampled).read("model_versions")["model_version"].to_list() == [0]  # nothing registered

    monkeypatch.delenv("RLVR_FAULT")
    again = train_policy(1, ddp, sampled)  # a new group, from version 0
    assert again["model_version"] == 1 and again["processes"] == 2


def test_lora_trains_under_ddp_as_in_one_process(sampled):
    from flows.iteration import train_policy

    lora = {"micro_batch_size": 5, "lora": {"r": 4, "alpha": 8}}
    one = train_policy(1, lora, sampled)
    two = train_policy(1, {**lora, "processes": 2}, sampled, parent=0)
    assert_same_step(one, two)
    single, ddp = weights(sampled, 1), weights(sampled, 2)  # adapters merged into the base on load
    for name in single:
        assert torch.allclose(single[name], ddp[name], atol=1e-6), name


def test_fsdp_refuses_lora_and_devices_must_match_the_ranks():
    from trainers.grpo import TrainConfig, rank_devices
    from trainers.workers import TrainerGroup

    with pytest.raises(ValueError, match="lora trains under ddp"):
        TrainerGroup(TrainConfig(processes=2, strategy="fsdp", lora={"r": 4}))
    with pytest.raises(ValueError, match="1 device.*2 process"):
        rank_devices(TrainConfig(processes=2, devices=["cuda:4"]))
    assert rank_devices(TrainConfig(processes=2, device="cuda")) == ["cuda:0", "cuda:1"]
    assert rank_devices(TrainConfig(processes=2, devices=["cuda:4", "cuda:5"])) == ["cuda:4", "cuda:5"]
    assert rank_devices(TrainConfig(processes=2)) == ["cpu", "cpu"]


def test_a_run_refuses_a_trainer_on_the_samplers_gpu_unless_the_config_allows_it():
    from flows.loop import check_layout
    from flows.run_config import RunConfig
    from policy.layout import LayoutRefused

    shared = {"rollout": {"devices": ["cuda:0"]}, "train": {"processes": 2, "strategy": "fsdp", "device": "cuda"}}
    with pytest.raises(LayoutRefused, match=r"share GPU\(s\) \[0\].*share_devices"):
        check_layout(RunConfig.model_validate(shared))
    check_layout(RunConfig.model_validate({**shared, "train": {**shared["train"], "share_devices": True}}))
    check_layout(RunConfig.model_validate({**shared, "train": {**shared["train"], "devices": ["cuda:1", "cuda:2"]}}))
    check_layout(RunConfig.model_validate({"train": {"processes": 2}}))  # CPUs are shared by design


def test_the_overlapped_loops_trainer_role_trains_on_persistent_ranks(prefect_api, tmp_path):
    """`loop.mode: async` with two DDP ranks: the trainer role steps the same ranks while the sampler samples."""
    import json

    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop
    from storage.lake import Lake
    from trainers.workers import GROUPS

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    overlapped = {
        **RUN,
        "loop": {"iterations": 2, "mode": "async", "max_staleness": 1},
        "train": {**RUN.get("train", {}), "processes": 2, "strategy": "ddp"},
    }
    rows = rl_loop(overlapped, lake_uri=lake_uri)
    assert [(r["iteration"], r["trained_version"]) for r in rows] == [(1, 1), (2, 2)]
    [group] = GROUPS.values()  # one group served both steps
    assert all(process.is_alive() for process in group.processes) and group.held_uri.endswith("v00002")
    trained = Lake.open(lake_uri).read("model_versions").filter(kind="rl").sort("model_version")
    assert [json.loads(m)["processes"] for m in trained["metrics"]] == [2, 2]
