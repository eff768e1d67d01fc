"""`rlvr bench sampling`: the hf backend's sampler against transformers' `generate` on the same model and batch.

Both sample the same prompts at temperature 1 with top-k and top-p off, to the same length cap, on one
thread count; `generate` also returns its per-step scores (`output_scores`), since the hf sampler
keeps the behaviour log-probs and self-certainty of every token. The models have random weights: about a
quarter of the tiny model's rows end before the cap (an end token); the hf sampler drops rows that ended from
the model's batch (policy/hf.py `NARROW_AT`), `generate` carries them padded to the end. The figure is
tokens generated up to each row's end per second, the best of a few alternating repeats, and the ratio
hf / generate (target ≥ 1.05).

`backend="vllm"`: the hf sampler against a real vLLM server instead (its CPU build from `.venv-vllm`, started by
`infra/vllm/serve.sh` on the same weights saved to a folder, float32), asked as the `openai` backend asks: one
request per prompt with `n` samples, token ids and log-probs, requests concurrent. vLLM's CPU build binds its
engine to one core and leaves the other to the server; the hf sampler uses torch's threads. Ratio: vllm / hf.

Shapes: `tiny` is the embedded default policy; `0.5b` is a Qwen2.5-0.5B-shaped config (24 layers,
hidden 896, vocabulary 151,936) built from scratch, which is where the per-token work over a large
vocabulary shows.
"""

from __future__ import annotations

import time

from bench.shapes import SHAPES, build  # noqa: F401  (build: the tests build from here too)

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/sampling.py",
    "bench/shapes.py",
    "policy/vllm_servers.py",
    "infra/vllm/serve.sh",
    "policy/openai_backend.py",
    "policy/hf.py",
    "policy/logprobs.py",
    "policy/sampling.py",
    "policy/tiny.py",
    "storage/progress.py",
)


def hf_tokens_per_second(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int) -> tuple[int, float]:
    from policy.hf import HFPolicy
    from policy.sampling import SamplerConfig

    policy = HFPolicy(model, tokenizer, 0, batch_size=len(prompts) * n)
    started = time.perf_counter()
    groups = policy.generate(prompts, n, SamplerConfig(max_new_tokens=max_new_tokens), seed=1, model_version=0)
    seconds = time.perf_counter() - started
    return sum(len(s.token_ids) for group in groups for s in group), seconds


def generate_tokens_per_second(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int) -> tuple[int, float]:
    import torch

    from policy.hf import stop_token_ids

    stops = sorted(stop_token_ids(model, tokenizer))
    encoded = tokenizer(
        [p for p in prompts for _ in range(n)], return_tensors="pt", padding=True, add_special_tokens=False
    )
    torch.manual_seed(1)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            **encoded,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=stops,
        )
    seconds = time.perf_counter() - started
    new = out.sequences[:, encoded.input_ids.shape[1] :]
    # a row's tokens up to and including its first end token; pads after it are not generated work
    ended = torch.isin(new, torch.tensor(stops))
    first_end = torch.where(ended.any(-1), ended.float().argmax(-1) + 1, torch.tensor(new.shape[1]))
    return int(first_end.sum()), seconds


def vllm_tokens_per_second(url: str, prompts: list[str], n: int, max_new_tokens: int) -> tuple[int, float]:
    from policy.openai_backend import OpenAIBackendConfig, OpenAIPolicy
    from policy.sampling import SamplerConfig

    client = OpenAIPolicy(
        OpenAIBackendConfig(
            endpoints=[url], model_name="policy", confirm_served=False, concurrency=max(1, len(prompts))
        )
    )
    try:
        started = time.perf_counter()
        groups = client.generate(prompts, n, SamplerConfig(max_new_tokens=max_new_tokens), seed=1, model_version=0)
        seconds = time.perf_counter() - started
    finally:
        client.close()
    return sum(len(s.token_ids) for group in groups for s in group), seconds


def compare_with_vllm(shape: str, prompts: int, group_size: int, max_new_tokens: int, repeats: int) -> dict:
    """The hf sampler against a vLLM server on the same weights, alternating."""
    import tempfile
    from functools import partial
    from pathlib import Path

    from policy import vllm_servers

    model, tokenizer = build(shape)
    texts = [f"{a} * {b} + {a + b} =" for a, b in zip(range(10, 10 + prompts), range(3, 3 + prompts))]
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-sampling-") as work:
        model.save_pretrained(Path(work) / "model")
        tokenizer.save_pretrained(Path(work) / "model")
        server = vllm_servers.serving(
            str(Path(work) / "model"), Path(work) / "logs", vllm_servers.free_port(), WEIGHTS="full"
        )
        try:
            measure = {
                "hf": partial(hf_tokens_per_second, model, tokenizer),
                "vllm": partial(vllm_tokens_per_second, server.url),
            }
            best = {name: 0.0 for name in measure}
            for name in measure:  # warm both once
                measure[name](texts[:1], 1, 4)
            for _ in range(repeats):
                for name in measure:
                    tokens, seconds = measure[name](texts, group_size, max_new_tokens)
                    best[name] = max(best[name], tokens / seconds)
        finally:
            server.stop()
    return {
        "shape": shape,
        "backend": "vllm",
        "rows": prompts * group_size,
        "max_new_tokens": max_new_tokens,
        "hf_tokens_per_s": round(best["hf"], 1),
        "vllm_tokens_per_s": round(best["vllm"], 1),
        "ratio": round(best["vllm"] / best["hf"], 3),
    }


def compare(shape: str, prompts: int, group_size: int, max_new_tokens: int, repeats: int) -> dict:
    model, tokenizer = build(shape)
    texts = [f"{a} * {b} + {a + b} =" for a, b in zip(range(10, 10 + prompts), range(3, 3 + prompts))]
    best = {"hf": 0.0, "generate": 0.0}
    measure = {"hf": hf_tokens_per_second, "generate": generate_tokens_per_second}
    measure["hf"](model, tokenizer, texts[:1], 1, 4)  # warm both paths once
    measure["generate"](model, tokenizer, texts[:1], 1, 4)
    for _ in range(repeats):  # alternating: drift hits both
        for name in ("hf", "generate"):
            tokens, seconds = measure[name](model, tokenizer, texts, group_size, max_new_tokens)
            best[name] = max(best[name], tokens / seconds)
    return {
        "shape": shape,
        "rows": prompts * group_size,
        "max_new_tokens": max_new_tokens,
        "hf_tokens_per_s": round(best["hf"], 1),
        "generate_tokens_per_s": round(best["generate"], 1),
        "ratio": round(best["hf"] / best["generate"], 3),
    }


def run_benchmark(shapes: list[str], repeats: int = 3, backend: str = "generate") -> list[dict]:
    import torch
    from rich.console import Console

    console = Console()
    batches = {"tiny": (48, 8, 48), "0.5b": (2, 4, 24)}  # (prompts, group size, new tokens): the demo's batch
    results = []
    for shape in shapes:
        prompts, group_size, max_new = batches[shape]
        if backend == "vllm":
            result = compare_with_vllm(shape, prompts, group_size, max_new, repeats)
            results.append(result)
            console.print(
                f"{shape}: {result['rows']} rows × ≤{max_new} tokens — vLLM (CPU build) "
                f"{result['vllm_tokens_per_s']:,.0f} tokens/s, hf {result['hf_tokens_per_s']:,.0f} tokens/s "
                f"({torch.get_num_threads()} threads): vLLM ×{result['ratio']:.2f}"
            )
            continue
        result = compare(shape, prompts, group_size, max_new, repeats)
        results.append(result)
        console.print(
            f"{shape}: {result['rows']} rows × ≤{max_new} tokens, {torch.get_num_threads()} threads — hf "
            f"{result['hf_tokens_per_s']:,.0f} tokens/s, generate {result['generate_tokens_per_s']:,.0f} "
            f"tokens/s: ×{result['ratio']:.2f} (target ≥ 1.05)"
        )
    return results
