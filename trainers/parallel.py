"""Data-parallel training steps: `train.processes: N` runs one batch's optimizer steps in N processes.

Each process loads the parent checkpoint itself, takes its share of every mini-batch and sums its
gradients with the others' (`trainers/grpo.py`), so the copies stay identical after every step;
process 0 hands back the trained weights, the optimizer state and the metrics, from which the caller
writes the one checkpoint. torch.distributed through accelerate: gloo on CPU, NCCL on GPUs (one GPU
a process). The processes are spawned per training step (torch.multiprocessing): each pays its
imports, a few seconds, which only a model too slow for one device repays. Each runs torch on its
share of the cores.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import polars as pl

from trainers.grpo import TrainConfig


def train_in_processes(parent_uri: str, rows: pl.DataFrame, config: TrainConfig, optimizer_state: dict | None,
                       reference_uri: str | None = None) -> tuple[dict, dict, dict]:
    """(trained state dict, metrics, optimizer state) of `config.processes` processes training the batch."""
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="rlvr-train-") as folder:
        work = Path(folder)
        rows.write_ipc(work / "rows.arrow")
        if optimizer_state is not None:
            torch.save(optimizer_state, work / "optimizer.pt")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        mp.spawn(_process, args=(config.processes, port, parent_uri, config.model_dump_json(), reference_uri, folder),
                 nprocs=config.processes, join=True)
        result = torch.load(work / "result.pt", map_location="cpu", weights_only=True)
    return result["model"], json.loads(result["metrics"]), result["optimizer_state"]


def _process(rank: int, world: int, port: int, parent_uri: str, config_json: str, reference_uri: str | None,
             folder: str) -> None:
    import torch

    from storage.threads import cores_given

    threads = os.environ.get("RLVR_TORCH_THREADS") or str(max(1, cores_given() // world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), RLVR_TORCH_THREADS=threads,
                      OMP_NUM_THREADS=threads)          # else accelerate sets the machine's count when it starts
    from trainers.grpo import train_on_batch
    from storage.checkpoints import load_policy
    from trainers.trainable import trainable_policy

    config = TrainConfig.model_validate_json(config_json)
    work = Path(folder)
    model, _, _ = trainable_policy(parent_uri, config)
    reference = load_policy(reference_uri, config.device)[0] if config.beta and reference_uri else None
    state = torch.load(work / "optimizer.pt", map_location="cpu", weights_only=True) \
        if (work / "optimizer.pt").exists() else None
    metrics, optimizer_state = train_on_batch(model, pl.read_ipc(work / "rows.arrow"), config, state, reference)
    if rank == 0:
        weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
        torch.save({"model": weights, "metrics": json.dumps(metrics), "optimizer_state": optimizer_state},
                   work / "result.pt")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
