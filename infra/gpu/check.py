"""The GPU check for a bare GPU host: torch, transformers (accelerate, peft optional) and this checkout;
no Prefect, Polars, Delta, DuckDB, pydantic or rich needed. One prepared run, well under 8 minutes.

Parts, each printed as one JSON line (`"part"`, `"ok"`, the numbers):

- `device`: the device, torch's and transformers' versions; `model`: the model built from its config.
- `sampling`: transformers' `generate` with scores on the batch: tokens/s, and the sampled batch the
  later parts use.
- `hf_sampler`: the project's hf sampler (`policy/hf.py`) on the same model and batch: tokens/s
  and its ratio to `generate`'s, and the gap between its behaviour log-probs and the trainer's
  recomputation (a sampler that lost its KV cache shows there); `skipped` when it cannot import (e.g.
  no pydantic).
- `logprob_gap`: behaviour log-probs of the sampled tokens against the trainer's recomputation
  (`policy/logprobs.py`), the quantity the importance ratio depends on.
- `training`: optimizer steps with the trainer's loss (`trainers/loss.py`: dapo, clip 0.2 / 0.28) under
  bf16 autocast: tokens/s.
- `vllm_server`: with `VLLM_ENV` naming a virtual environment that holds vLLM, `infra/vllm/serve.sh
  WEIGHTS=full` on the model (`infra/gpu/vllm_part.py`): the gap between its sampled log-probs and the
  trainer's, a full-weight swap to other weights (its seconds, the version reported) and the gap after it;
  `skipped` without `VLLM_ENV`.
- `data_parallel`: the same batch split over `--processes` data-parallel processes (NCCL on GPUs, gloo
  on CPU): their summed gradient against one process's gradient on the whole batch. It runs by default
  on a host with 2+ GPUs; otherwise its line says why it was skipped.

Isolation: an exception in a part (an ImportError, a TypeError from a transformers version without a
call the project uses, CUDA running out of memory, ...) becomes that part's line, `{"part": ...,
"ok": false, "error": "TypeError: ...", "traceback": [its last lines]}`, with the whole traceback on
stderr, and the next part runs; a part that needs an earlier part's output (`logprob_gap`, `training`
and `data_parallel` need the sampled batch) says it was skipped because that part failed. The exit
status is 1 when a part failed, else 0. To test the isolation, `RLVR_GPU_CHECK_FAIL=sampling` (a
comma-separated list of part names) makes those parts raise a RuntimeError as they start. A part that ran
but whose check failed (`"ok": false`, e.g. a log-prob gap past 1e-3) also makes the exit status 1.

stdout holds the JSON lines only: everything else written to stdout (prints, C libraries, logging
handlers bound to it) goes to stderr, and so do warnings, transformers' logging and tracebacks.

Timing: each timed thing (`generate`, the hf sampler, the training steps) runs once untimed first (a
short sample on two prompts; one training step), so kernel selection and the allocator's first growth
are not timed.

Models are built from configs with random weights (nothing is downloaded): `--shape tiny` (about
1 M parameters), `--shape small` (head size 32, the least vLLM's CPU build serves) or `--shape 0.5b`
(Qwen2-0.5B's shape). `RLVR_TORCH_THREADS`, when set, is torch's
CPU thread count in each process. `python infra/gpu/check.py --device cpu --shape tiny --processes 2`
runs it anywhere (the tests do).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's torch-only modules
sys.path.insert(0, str(Path(__file__).resolve().parent))  # measures, vllm_part

from measures import (  # noqa: E402  (found through the path above)
    SHAPES,
    behaviour_gap,
    build,
    gradient,
    prompts_of,
    sample_with_generate,
    sample_with_project,
    train_steps,
    use_threads,
)

FAIL_ENV = "RLVR_GPU_CHECK_FAIL"  # test hook: parts that raise on purpose
TRACEBACK_LINES = 8  # the tail of a failed part's traceback kept in its line


def data_parallel(rank: int, world: int, args, batch: dict, expected: torch.Tensor, port: int, out: str) -> None:
    """One of `world` processes: its share of the batch, gradients summed over processes."""
    from datetime import timedelta

    import torch.distributed as dist

    use_threads()
    device = f"cuda:{rank}" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    model = build(args.shape, device)
    rows = torch.arange(batch["tokens"].shape[0])[rank::world]
    total = float(batch["tokens"].numel())  # dapo: the whole batch's token count normalises
    mine = gradient(
        model,
        batch["prompts"][rows],
        batch["tokens"][rows],
        batch["behaviour"][rows],
        batch["advantages"][rows],
        total,
        torch.float32,
    )
    dist.all_reduce(mine)
    if rank == 0:
        gap = float((mine.cpu() - expected).abs().max() / expected.abs().max())
        Path(out).write_text(
            json.dumps({"processes": world, "backend": dist.get_backend(), "max_relative_gradient_gap": gap})
        )
    dist.destroy_process_group()
    # End without Python's shutdown: a gloo/NCCL worker thread letting go of the collective's tensors then needs
    # the GIL, and Python ends such a thread with pthread_exit, which aborts the rank (SIGABRT, "terminate called
    # without an active exception"; pytorch/pytorch#179291). The result is written; only stdio is left to flush.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def json_lines_out():
    """The real stdout, kept for the JSON lines; everything else written to stdout from here on (print, C
    libraries, logging handlers and child processes bound to it) goes to stderr, at the file-descriptor
    level. Warnings and logging go to stderr as well."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
        out = os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8")
        os.dup2(sys.stderr.fileno(), fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # no file descriptor behind it
        out = sys.stdout
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)  # Python warnings through logging, to stderr
    return out


class Check:
    """Runs parts one by one, each isolated: its JSON line, or an error line, and the next part runs."""

    def __init__(self, out, fail: set[str]):
        self.out, self.fail = out, fail
        self.results: dict[str, object] = {}
        self.failed: dict[str, str] = {}  # part -> "failed" or "skipped"
        self.unhealthy: list[str] = []  # parts that ran and reported "ok": false (a gap too large)

    def emit(self, record: dict) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def part(self, name: str, body, needs: tuple[str, ...] = ()):
        """body() -> (record, value): record is the part's line, value what later parts use (kept in
        self.results[name]). Returns value, or None when the part failed or was skipped."""
        for need in needs:
            if need in self.failed:
                self.failed[name] = "skipped"
                self.emit(
                    {
                        "part": name,
                        "skipped": f"part {need} {self.failed[need]}: this part needs its output",
                        "ok": False,
                    }
                )
                return None
        failure = None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                if name in self.fail:
                    raise RuntimeError(f"{FAIL_ENV} names part {name}: raised on purpose")
                record, value = body()
        except Exception as error:  # noqa: BLE001 -- any failure is this part's line; the next part runs
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            print(f"part {name} failed:\n{text}", file=sys.stderr, flush=True)
            lines = [line for line in text.rstrip().splitlines() if not line.startswith("Traceback (most recent")]
            failure = {
                "part": name,
                "ok": False,
                "error": f"{type(error).__name__}: {error}"[:500],
                "traceback": lines[-TRACEBACK_LINES:],
            }
        if failure:
            self.failed[name] = "failed"
            self.emit(failure)
            free_memory()  # the traceback's frames are gone: e.g. after running out of memory
            return None
        if "skipped" not in record:
            record.setdefault("ok", True)
        self.emit({"part": name, **record})
        if record.get("ok") is False:
            self.unhealthy.append(name)
        self.results[name] = value
        return value


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("transformers", "accelerate", "peft"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def single_process_reason(args) -> str | None:
    """Why the data-parallel part does not run, or None when it does."""
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.processes is None:
        if args.device != "cuda":
            return (
                f"--device {args.device}: the 2-process part runs by default on 2+ GPUs (NCCL); "
                "--processes 2 runs it here (gloo)"
            )
        if gpus < 2:
            return f"{gpus} GPU visible: the 2-process NCCL part needs 2"
        return None
    if args.processes < 2:
        return f"--processes {args.processes}: the data-parallel part needs 2 or more"
    if args.device == "cuda" and gpus < args.processes:
        return f"{gpus} GPUs visible: --processes {args.processes} needs {args.processes} (NCCL, one per process)"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--batch", type=int, default=64, help="sequences sampled together")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=3, help="timed steps, after one untimed warm-up step")
    parser.add_argument("--processes", type=int, default=None, help="data-parallel processes (default: 2 on 2+ GPUs)")
    parser.add_argument("--vllm-start-s", type=float, default=180, help="the vLLM server's time to answer")
    args = parser.parse_args()
    if args.train_steps < 1:
        parser.error("--train-steps must be at least 1")
    check = Check(json_lines_out(), {name.strip() for name in os.environ.get(FAIL_ENV, "").split(",") if name.strip()})
    use_threads()

    def device():
        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no GPU visible to torch (use --device cpu to run the check on the CPU)")
        name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
        gpus = torch.cuda.device_count() if args.device == "cuda" else 0
        return {"device": name, "gpus": gpus, "torch": torch.__version__, **versions(), "shape": args.shape}, None

    def model():
        started = time.perf_counter()
        built = build(args.shape, args.device)
        return {
            "parameters": sum(p.numel() for p in built.parameters()),
            "seconds": round(time.perf_counter() - started, 2),
        }, built

    check.part("device", device)
    built = check.part("model", model, needs=("device",))
    prompts = prompts_of(args.batch, args.prompt_tokens, SHAPES[args.shape]["vocab_size"])

    def sampling():
        sample_with_generate(built, prompts[:2], 4)  # warm-up: kernels, allocator
        generated = sample_with_generate(built, prompts, args.new_tokens)
        return {"generate_tokens_per_s": round(generated["tokens_per_s"], 1)}, generated

    def hf_sampler():
        try:
            import policy.hf
            import policy.sampling  # noqa: F401
        except ImportError as error:
            return {"skipped": f"the project's sampler needs {error.name}"}, None
        sample_with_project(built, prompts[:2], 4)  # warm-up
        sampled = sample_with_project(built, prompts, args.new_tokens)
        generated = check.results.get("sampling")
        gap = behaviour_gap(built, prompts, sampled["tokens"], sampled["behaviour"])
        return {
            "tokens_per_s": round(sampled["tokens_per_s"], 1),
            "ratio_to_generate": round(sampled["tokens_per_s"] / generated["tokens_per_s"], 3) if generated else None,
            "max_abs_gap": gap,
            "ok": gap < 1e-3,
        }, None

    generated = check.part("sampling", sampling, needs=("model",))
    check.part("hf_sampler", hf_sampler, needs=("model",))

    def logprob_gap():
        gap = behaviour_gap(built, prompts, generated["tokens"].tolist(), generated["behaviour"].tolist())
        return {"max_abs_gap": gap, "ok": gap < 1e-3}, None

    check.part("logprob_gap", logprob_gap, needs=("model", "sampling"))

    dtype = torch.bfloat16 if args.device == "cuda" or args.shape == "tiny" else torch.float32

    def training():
        trained = train_steps(built, prompts, generated["tokens"], generated["behaviour"], args.train_steps, dtype)
        return {
            "dtype": str(dtype).removeprefix("torch."),
            "steps": args.train_steps,
            "tokens_per_s": round(trained["tokens_per_s"], 1),
            "loss": trained["loss"],
        }, None

    check.part("training", training, needs=("model", "sampling"))

    def vllm_server():
        vllm_env = os.environ.get("VLLM_ENV")
        if not vllm_env:
            return {"skipped": "no VLLM_ENV: name a virtual environment holding vLLM to check its server"}, None
        from vllm_part import check_server

        replacement = build(args.shape, args.device, seed=1)
        try:
            return check_server(
                built, replacement, prompts[:8], min(args.new_tokens, 32), vllm_env, args.vllm_start_s, behaviour_gap
            ), None
        finally:
            del replacement
            free_memory()

    check.part("vllm_server", vllm_server, needs=("model",))

    def parallel():
        import socket
        import tempfile

        import torch.multiprocessing as mp

        world = args.processes or 2
        batch = {
            "prompts": prompts,
            "tokens": generated["tokens"],
            "behaviour": generated["behaviour"],
            "advantages": torch.linspace(-1, 1, args.batch),
        }
        whole = build(args.shape, args.device)
        expected = gradient(
            whole, batch["prompts"], batch["tokens"], batch["behaviour"], batch["advantages"], None, torch.float32
        ).cpu()
        del whole
        free_memory()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with tempfile.TemporaryDirectory() as folder:
            out = str(Path(folder) / "result.json")
            mp.spawn(data_parallel, args=(world, args, batch, expected, port, out), nprocs=world, join=True)
            result = json.loads(Path(out).read_text())
        return {**result, "ok": result["max_relative_gradient_gap"] < 1e-4}, None

    reason = single_process_reason(args)
    if reason:
        check.emit({"part": "data_parallel", "skipped": reason})
    else:
        check.part("data_parallel", parallel, needs=("sampling",))
    return 1 if "failed" in check.failed.values() or check.unhealthy else 0


if __name__ == "__main__":
    sys.exit(main())
