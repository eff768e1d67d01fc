"""`rlvr bench train --processes N --strategy ddp|fsdp`: a training step on N persistent ranks against one process
with the same total threads, on the same batch.

One process trains with all the cores' threads (`train_on_batch`); N ranks (`trainers/workers.py`, gloo on a
CPU) train with a share each, the batch split between them. Both sides start from the same checkpoint,
train `repeats` steps of the same batch one after another (the ranks keep the model and optimizer in memory,
as in a run) and write no checkpoint, so what is timed is the step itself: forward, loss, backward, the
ranks' gradient reduction and the optimizer step. The ranks' start-up (spawn, the process group, the
checkpoint loaded, the model wrapped) is measured apart, as the first step's extra time over a later one.
Target: N ranks ≤ 1.15× one process's step time, with no process started per step.

Shapes (`bench/shapes.py`): `tiny`, the default policy, on a full batch; `0.5b`, Qwen2.5-0.5B's shape, on a
small one (its step on two cores takes tens of seconds).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

from bench.shapes import build
from flows.display import console

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/train_ranks.py",
    "bench/shapes.py",
    "trainers/grpo.py",
    "trainers/distributed.py",
    "trainers/workers.py",
    "trainers/loss.py",
    "trainers/trainable.py",
    "policy/logprobs.py",
    "policy/checkpoints.py",
)

BATCHES = {"tiny": (128, 24, 40), "0.5b": (8, 24, 32)}  # sequences, prompt tokens, response tokens


def synthetic_rows(model, sequences: int, prompt_length: int, response_length: int, seed: int = 0) -> pl.DataFrame:
    """A batch as the trainer reads it: token ids, on-policy behaviour log-probs, advantages, weight 1."""
    import torch

    from policy.logprobs import response_logprobs

    generator = torch.Generator().manual_seed(seed)
    vocabulary = min(model.config.vocab_size, 250)
    prompts = torch.randint(4, vocabulary, (sequences, prompt_length), generator=generator).tolist()
    responses = torch.randint(4, vocabulary, (sequences, response_length), generator=generator).tolist()
    with torch.no_grad():
        logprobs = torch.cat(
            [response_logprobs(model, prompts[i : i + 8], responses[i : i + 8])[0] for i in range(0, sequences, 8)]
        )
    return pl.DataFrame(
        {
            "prompt_token_ids": prompts,
            "response_token_ids": responses,
            "behaviour_logprobs": logprobs.tolist(),
            "advantage": torch.randn(sequences, generator=generator).tolist(),
            "weight": [1.0] * sequences,
            "temperature": [1.0] * sequences,
        },
        schema_overrides={"prompt_token_ids": pl.List(pl.Int32), "response_token_ids": pl.List(pl.Int32)},
    )


def one_shape(shape: str, processes: int, strategy: str, repeats: int, threads: int) -> dict:
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from trainers.grpo import TrainConfig, train_on_batch
    from trainers.workers import trainer_group

    sequences, prompt_length, response_length = BATCHES[shape]
    model, tokenizer = build(shape)
    rows = synthetic_rows(model, sequences, prompt_length, response_length)
    config = TrainConfig(micro_batch_size=8, learning_rate=1e-5)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-ranks-") as work:
        parent = str(Path(work) / "parent")
        model.save_pretrained(parent)
        tokenizer.save_pretrained(parent)
        rows.write_ipc(Path(work) / "rows.arrow")
        del model  # the ranks first, while this process holds no model: at the 0.5B shape
        gc.collect()  # two DDP ranks and one process's optimizer state do not fit 24 GiB together

        ranked = config.model_copy(update={"processes": processes, "strategy": strategy})
        times = []
        group = trainer_group(ranked)
        try:
            for _ in range(repeats + 1):  # the first step pays the start-up
                began = time.perf_counter()
                group.step(None, 0, parent, None, ranked, rows_file=str(Path(work) / "rows.arrow"))
                times.append(time.perf_counter() - began)
            pids_kept = all(process.is_alive() for process in group.processes)
        finally:
            group.close()

        model = AutoModelForCausalLM.from_pretrained(parent)  # the same weights, for one process
        torch.set_num_threads(threads)  # one process, every thread
        single = []
        train_on_batch(model, rows, config)  # warm-up, as the ranks' first step is
        for _ in range(repeats):
            started = time.perf_counter()
            train_on_batch(model, rows, config)
            single.append(time.perf_counter() - started)
    step_seconds, single_seconds = statistics.median(times[1:]), statistics.median(single)
    figures = {
        "shape": shape,
        "sequences": sequences,
        "tokens_per_step": sequences * response_length,
        "step_seconds": step_seconds,
        "single_step_seconds": single_seconds,
        "ratio": step_seconds / single_seconds,
        "startup_seconds": times[0] - step_seconds,
        "same_processes_every_step": pids_kept,
    }
    console.print(
        f"{shape}: {processes} {strategy} ranks {step_seconds:.2f} s a step against {single_seconds:.2f} s in "
        f"one process ({threads} threads) — ×{figures['ratio']:.2f}; start-up {figures['startup_seconds']:.1f} s"
    )
    return figures


def run_benchmark(
    processes: int = 2, strategy: str = "ddp", shapes: tuple[str, ...] = ("tiny", "0.5b"), repeats: int = 3
) -> dict:
    """Per shape: the ranks' step, one process's, their ratio and the ranks' start-up. The top-level keys are
    the last shape's (the larger model), so that one line of JSON says the headline."""
    from policy.threads import cores_given

    threads = cores_given()
    measured = [one_shape(shape, processes, strategy, repeats, threads) for shape in shapes]
    headline = measured[-1]
    return {
        "strategy": strategy,
        "processes": processes,
        "threads": threads,
        **{key: headline[key] for key in ("step_seconds", "single_step_seconds", "ratio", "startup_seconds")},
        "shapes": measured,
    }
