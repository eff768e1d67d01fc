"""The GPU check for a bare GPU host: torch, transformers (accelerate, peft optional) and this checkout;
no Prefect, Polars, Delta, DuckDB, pydantic or rich needed. One prepared run, well under 8 minutes.

1. Sampling on the device, on the same model and batch: transformers' `generate` with scores, and the
   project's hf sampler (`tasks/rollout/hf.py`) when it imports (it needs pydantic); tokens/s of each.
2. The log-prob gap: behaviour log-probs of the sampled tokens against the trainer's recomputation
   (`tasks/rollout/logprobs.py`), the quantity the importance ratio depends on.
3. Training steps with the trainer's loss (`trainers/loss.py`: dapo, clip 0.2 / 0.28) under bf16
   autocast: tokens/s. With `--processes 2` (default on a host with 2+ GPUs), the same batch split over
   two data-parallel processes (NCCL on GPUs, gloo on CPU): their summed gradient against one
   process's gradient on the whole batch.

Models are built from configs with random weights (nothing is downloaded): `--shape tiny` (about
1 M parameters) or `--shape 0.5b` (Qwen2-0.5B's shape). Prints one JSON line per part.
`python infra/gpu/check.py --device cpu --shape tiny --processes 2` runs it anywhere (the tests do).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))      # the checkout's torch-only modules

from tasks.rollout.logprobs import response_logprobs  # noqa: E402
from trainers.loss import policy_loss  # noqa: E402

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
}


def build(shape: str, device: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Qwen2ForCausalLM(config).to(device).eval()


def prompts_of(count: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (count, length), generator=generator)


def sample_with_generate(model, prompts: torch.Tensor, new_tokens: int) -> dict:
    """generate with scores: sampled tokens and their behaviour log-probs (temperature 1, no top-k / top-p, no
    end token, so every row does the same work and no logits processor changes the scores)."""
    device = model.device
    ids = prompts.to(device)
    sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=new_tokens, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    sync(device)
    seconds = time.perf_counter() - started
    tokens = out.sequences[:, ids.shape[1]:]                                              # [B, T]
    scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)                       # [B, T, V]
    behaviour = scores.gather(-1, tokens[..., None]).squeeze(-1)                          # [B, T]
    return {"tokens": tokens.cpu(), "behaviour": behaviour.cpu(), "tokens_per_s": tokens.numel() / seconds}


def sample_with_project(model, prompts: torch.Tensor, new_tokens: int) -> dict | None:
    """The project's hf sampler on the same model and batch; None when it cannot import (no pydantic)."""
    try:
        from tasks.rollout.hf import HFPolicy
        from tasks.rollout.sampling import SamplerConfig
    except ImportError as error:
        return {"skipped": f"the project's sampler needs {error.name}"}

    class Ids:                                            # a tokenizer over token ids: prompts are ids already
        eos_token_id, pad_token_id = 2, 0

        def __call__(self, text: str, **_):
            return type("Encoded", (), {"input_ids": [int(t) for t in text.split()]})()

        def decode(self, ids, **_):
            return " ".join(map(str, ids))

        def batch_decode(self, rows, **_):
            return [self.decode(row) for row in rows]

        def get_vocab(self):
            return {}

        def convert_tokens_to_ids(self, token):
            return None

    texts = [" ".join(map(str, row.tolist())) for row in prompts]
    policy = HFPolicy(model, Ids(), 0, batch_size=len(texts))
    sampler = SamplerConfig(max_new_tokens=new_tokens)
    sync(model.device)
    started = time.perf_counter()
    groups = policy.generate(texts, 1, sampler, seed=0, model_version=0)
    sync(model.device)
    seconds = time.perf_counter() - started
    return {"tokens_per_s": sum(len(group[0].token_ids) for group in groups) / seconds}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def loss_of(model, prompts, tokens, behaviour, advantages, token_normaliser, dtype):
    autocast = torch.autocast(device_type=model.device.type, dtype=dtype, enabled=dtype != torch.float32)
    with autocast:
        logprobs, mask, _ = response_logprobs(model, prompts.tolist(), tokens.tolist())
    return policy_loss(logprobs, behaviour.to(logprobs.device), advantages.to(logprobs.device), mask,
                       loss_type="dapo", token_normaliser=token_normaliser).loss


def train_steps(model, prompts, tokens, behaviour, steps: int, dtype) -> dict:
    """`steps` optimizer steps of the trainer's loss on the sampled batch: tokens/s."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    advantages = torch.linspace(-1, 1, tokens.shape[0])
    sync(model.device)
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model, prompts, tokens, behaviour, advantages, None, dtype)
        loss.backward()
        optimizer.step()
    sync(model.device)
    seconds = time.perf_counter() - started
    model.eval()
    return {"tokens_per_s": steps * tokens.numel() / seconds, "loss": float(loss.detach())}


def gradient(model, prompts, tokens, behaviour, advantages, normaliser, dtype) -> torch.Tensor:
    model.zero_grad()
    loss_of(model, prompts, tokens, behaviour, advantages, normaliser, dtype).backward()
    return torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def data_parallel(rank: int, world: int, args, batch: dict, expected: torch.Tensor, port: int, out: str) -> None:
    """One of `world` processes: its share of the batch, gradients summed over processes."""
    import torch.distributed as dist

    device = f"cuda:{rank}" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world)
    model = build(args.shape, device)
    rows = torch.arange(batch["tokens"].shape[0])[rank::world]
    total = float(batch["tokens"].numel())                   # dapo: the whole batch's token count normalises
    mine = gradient(model, batch["prompts"][rows], batch["tokens"][rows], batch["behaviour"][rows],
                    batch["advantages"][rows], total, torch.float32)
    dist.all_reduce(mine)
    if rank == 0:
        gap = float((mine.cpu() - expected).abs().max() / expected.abs().max())
        Path(out).write_text(json.dumps({"processes": world, "backend": dist.get_backend(),
                                         "max_relative_gradient_gap": gap}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--batch", type=int, default=64, help="sequences sampled together")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=None, help="data-parallel processes (default: 2 on 2+ GPUs)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no GPU visible to torch (use --device cpu to run the check on the CPU)")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(json.dumps({"part": "device", "device": name, "torch": torch.__version__, "shape": args.shape}), flush=True)

    model = build(args.shape, args.device)
    prompts = prompts_of(args.batch, args.prompt_tokens, model.config.vocab_size)
    sample_with_generate(model, prompts[:2], 4)                   # warm-up: kernels, allocator
    generated = sample_with_generate(model, prompts, args.new_tokens)
    ours = sample_with_project(model, prompts, args.new_tokens)
    print(json.dumps({"part": "sampling", "generate_tokens_per_s": round(generated["tokens_per_s"], 1),
                      "hf_sampler": ours if "skipped" in ours else round(ours["tokens_per_s"], 1),
                      "ratio_hf_to_generate": None if "skipped" in ours else
                      round(ours["tokens_per_s"] / generated["tokens_per_s"], 3)}), flush=True)

    with torch.no_grad():
        again, mask, _ = response_logprobs(model, prompts.tolist(), generated["tokens"].tolist())
    gap = float(((again.cpu() - generated["behaviour"]).abs() * mask.cpu()).max())
    print(json.dumps({"part": "logprob_gap", "max_abs_gap": gap, "ok": gap < 1e-3}), flush=True)

    dtype = torch.bfloat16 if args.device == "cuda" or args.shape == "tiny" else torch.float32
    trained = train_steps(model, prompts, generated["tokens"], generated["behaviour"], args.train_steps, dtype)
    print(json.dumps({"part": "training", "dtype": str(dtype).removeprefix("torch."), "steps": args.train_steps,
                      "tokens_per_s": round(trained["tokens_per_s"], 1), "loss": trained["loss"]}), flush=True)

    world = args.processes or (2 if args.device == "cuda" and torch.cuda.device_count() >= 2 else 1)
    if world > 1:
        import socket
        import tempfile

        import torch.multiprocessing as mp

        batch = {"prompts": prompts, "tokens": generated["tokens"], "behaviour": generated["behaviour"],
                 "advantages": torch.linspace(-1, 1, args.batch)}
        whole = build(args.shape, args.device)
        expected = gradient(whole, batch["prompts"], batch["tokens"], batch["behaviour"], batch["advantages"],
                            None, torch.float32).cpu()
        del whole
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        out = tempfile.mktemp(suffix=".json")
        mp.spawn(data_parallel, args=(world, args, batch, expected, port, out), nprocs=world, join=True)
        result = json.loads(Path(out).read_text())
        print(json.dumps({"part": "data_parallel", **result, "ok": result["max_relative_gradient_gap"] < 1e-4}),
              flush=True)


if __name__ == "__main__":
    main()
