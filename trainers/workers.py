"""Persistent trainer ranks: `train.processes` processes on torch.distributed, started once and kept between steps.

torchrun's semantics, launched from this process: ranks 0..N-1 are spawned once per run (gloo on CPU, NCCL
on GPUs), each on its own device (`train.devices`), and each keeps the model (DDP: a full copy; FSDP2: its
shard) and the optimizer state in memory from one step to the next. A step's command names the lake, the
iteration, the parent version's checkpoint and the version number to write: every rank reads the batch from
the lake and trains its share (`trainers/grpo.py: train_steps`), rank 0 writes the checkpoint (under FSDP
the ranks first gather the full weights and optimizer state to it), and this process, which holds the
stage's run, registers the version. Ranks holding another version than the parent (a branch, a resume, a
first step) load the parent's checkpoint and optimizer state first.

A rank that dies (`kill -9`, out of memory) or raises fails the step with an error naming it; the other ranks,
blocked in a collective, are stopped, and the next step starts a new group from the last registered version.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

from policy.checkpoints import adapter_base, load_policy, load_training_state, save_checkpoint
from policy.threads import cores_given
from storage import faults
from storage.lake import Lake
from trainers.batch import training_rows
from trainers.distributed import Distributed, indexed_optimizer_state, trainable_names, unwrapped
from trainers.grpo import TrainConfig, build_optimizer, rank_devices, strategy_of, train_steps
from trainers.trainable import trainable_policy

STRUCTURE = ("strategy", "processes", "devices", "device", "lora", "mixed_precision")  # what a group is built for


class RankFailed(RuntimeError):
    """A trainer rank died or raised during a step; the group is gone and the step did not happen."""


@dataclass
class TrainerGroup:
    """The ranks of one run, and what they hold."""

    config: TrainConfig
    processes: list = field(default_factory=list)
    connections: list = field(default_factory=list)
    held_uri: str | None = None  # the checkpoint whose weights the ranks hold (the last they wrote)

    def __post_init__(self):
        import torch.multiprocessing as mp

        if strategy_of(self.config) == "fsdp" and self.config.lora is not None:
            raise ValueError(
                "train.lora trains under ddp (the adapter is small enough to replicate); fsdp shards full fine-tuning"
            )
        context = mp.get_context("spawn")
        devices, port = rank_devices(self.config), free_port()
        for rank in range(self.config.processes):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=rank_main,
                name=f"rlvr-trainer-rank-{rank}",
                daemon=True,
                args=(rank, self.config.processes, port, strategy_of(self.config), devices[rank], theirs),
            )
            process.start()
            theirs.close()
            self.processes.append(process)
            self.connections.append(mine)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def step(
        self,
        lake_uri: str | None,
        iteration: int,
        parent_uri: str,
        version: int | None,
        config: TrainConfig,
        reference_uri: str | None = None,
        rows_file: str | None = None,
    ) -> dict:
        """Train the iteration's batch from `parent_uri` on every rank; rank 0's reply: uri, metrics, adapter_of.
        A benchmark's step: `rows_file` (Arrow IPC) instead of the lake's batch, and `version` None writes no
        checkpoint (the ranks keep training what they hold)."""
        command = {
            "lake_uri": lake_uri,
            "iteration": iteration,
            "parent_uri": parent_uri,
            "version": version,
            "config": config.model_dump_json(),
            "reference_uri": reference_uri,
            "rows_file": rows_file,
            "reload": parent_uri != self.held_uri,
        }
        for connection in self.connections:
            try:
                connection.send(command)
            except OSError:  # a rank already gone: _replies names it
                pass
        replies = self._replies()
        self.held_uri = replies[0]["uri"] or parent_uri
        return replies[0]

    def _replies(self) -> dict[int, dict]:
        replies: dict[int, dict] = {}
        while len(replies) < len(self.processes):
            for rank, (process, connection) in enumerate(zip(self.processes, self.connections)):
                if rank in replies:
                    continue
                try:
                    if connection.poll(0.1):
                        replies[rank] = connection.recv()
                        if "error" in replies[rank]:
                            self._fail(
                                f"trainer rank {rank} of {len(self.processes)} failed: "
                                f"{replies[rank]['error']}\n{replies[rank]['traceback']}"
                            )
                        continue
                except (EOFError, OSError):
                    pass  # its end of the pipe closed: it died, checked below
                if not process.is_alive():
                    self._fail("")
        return replies

    def _fail(self, error: str) -> None:
        """Stop the group and raise, naming a rank that died first: the others' errors (a collective whose peer
        vanished) follow from it. A rank's own error when none died."""
        deadline = time.monotonic() + 3  # a dead peer's exit shows a moment after the others fail
        dead = []
        while not dead and time.monotonic() < deadline:
            dead = [(rank, p) for rank, p in enumerate(self.processes) if not p.is_alive() and p.exitcode != 0]
            if not dead and error:
                time.sleep(0.1)
            elif not dead:
                dead = [(rank, p) for rank, p in enumerate(self.processes) if not p.is_alive()]
        self.close()
        if not dead:
            raise RankFailed(error)
        rank, process = dead[0]
        code = process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        raise RankFailed(
            f"trainer rank {rank} of {len(self.processes)} (pid {process.pid}) died during the training "
            f"step ({how}); nothing was registered: the step can be run again from the last registered "
            "version" + (f". Then {error.splitlines()[0]}" if error else "")
        )

    def close(self) -> None:
        """Stop every rank (those blocked in a collective with a dead one too) and forget the group."""
        for connection in self.connections:
            try:
                connection.send(None)
            except (OSError, BrokenPipeError):
                pass
        for process in self.processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for key, group in list(GROUPS.items()):
            if group is self:
                del GROUPS[key]


GROUPS: dict[str, TrainerGroup] = {}


def trainer_group(config: TrainConfig) -> TrainerGroup:
    """The run's group for this config's structure, started at its first step and kept until it fails."""
    key = config.model_dump_json(include=set(STRUCTURE))
    if key not in GROUPS:
        for other in list(GROUPS.values()):  # another structure: its ranks would hold the devices
            other.close()
        GROUPS[key] = TrainerGroup(config)
    return GROUPS[key]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, world: int, port: int, strategy: str, device: str, connection) -> None:
    """One rank's life: join the group, then train each step it is sent until told to stop."""

    threads = os.environ.get("RLVR_TORCH_THREADS") or str(max(1, cores_given() // world))
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        RLVR_TORCH_THREADS=threads,
        OMP_NUM_THREADS=threads,
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(threads))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        "nccl" if device.startswith("cuda") else "gloo", rank=rank, world_size=world, timeout=timedelta(minutes=30)
    )
    held: dict = {}
    try:
        while (command := connection.recv()) is not None:
            try:
                connection.send(train_step(held, strategy, device, command))
            except Exception as error:  # the group cannot go on once one rank left a collective
                connection.send(
                    {"error": f"{type(error).__name__}: {error}", "traceback": "".join(traceback.format_exc(limit=-6))}
                )
                break
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    end_rank()


def end_rank() -> None:
    """End a spawned rank without Python's shutdown. A gloo or NCCL worker thread can still be letting go of
    a finished collective's tensors when the rank returns; a tensor Python also holds needs the GIL for that,
    and a thread asking for the GIL while Python shuts down is ended by `pthread_exit`, which aborts the process
    through C++'s `std::terminate` ("terminate called without an active exception", pytorch/pytorch#179291).
    The rank has sent its last reply and the group is destroyed: nothing is left to flush but stdio."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_step(held: dict, strategy: str, device: str, command: dict) -> dict:
    """One step on this rank: (re)load the parent when told, train its share, rank 0 writes the checkpoint."""
    import polars as pl
    import torch.distributed as dist

    config = TrainConfig.model_validate_json(command["config"])
    placement = Distributed(strategy, device, config.mixed_precision)
    parent = command["parent_uri"]
    loaded = command["reload"] or not held
    if loaded:
        model, tokenizer, adapter_of = trainable_policy(parent, config.model_copy(update={"device": "cpu"}))
        model = placement.wrap(model)
        optimizer, step = build_optimizer(model, config)
        state = load_training_state(parent) if (adapter_base(parent) is not None) == (config.lora is not None) else None
        if state:
            placement.load_optimizer(model, optimizer, state["optimizer"])
            step = state["step"]
        held.update(model=model, tokenizer=tokenizer, adapter_of=adapter_of, optimizer=optimizer, step=step)
    model, optimizer = held["model"], held["optimizer"]
    for group in optimizer.param_groups:  # the config decides, as build_optimizer does
        group["weight_decay"] = config.weight_decay
    faults.point(f"rank-ready:{dist.get_rank()}")  # tests kill a rank here, mid-step
    lake = Lake.open(command["lake_uri"]) if command["lake_uri"] else None
    rows = pl.read_ipc(command["rows_file"]) if command["rows_file"] else training_rows(lake, command["iteration"])[0]
    reference = load_policy(command["reference_uri"], device)[0] if config.beta and command["reference_uri"] else None
    metrics, held["step"] = train_steps(model, optimizer, held["step"], rows, config, placement, reference)
    metrics.pop("mismatch_rows")  # each rank saw its share: the mismatch table is kept on one process only
    reply = {"rank": dist.get_rank(), "uri": None, "metrics": metrics, "loaded_parent": loaded}
    if command["version"] is None:  # a benchmark's step: nothing written
        return reply
    weights, optimizer_state = placement.full_state(model, optimizer)  # a collective under FSDP
    if dist.get_rank() == 0:
        state = {"optimizer": indexed_optimizer_state(optimizer_state, trainable_names(model)), "step": held["step"]}
        uri = save_checkpoint(
            lake,
            command["version"],
            unwrapped(model),
            held["tokenizer"],
            state,
            held["adapter_of"],
            state_dict=weights,
            cache=False,
        )
        reply |= {"uri": uri, "adapter_of": held["adapter_of"]}
    dist.barrier()  # no rank starts the next step before the checkpoint exists
    return reply
