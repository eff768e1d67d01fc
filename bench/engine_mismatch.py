"""`rlvr bench mismatch`: how far real vLLM servers' behaviour log-probs are from the fp32 trainer's, per token
and per sequence, by the server's dtype.

Each dtype gets its own server (`infra/vllm/serve.sh WEIGHTS=full DTYPE=...` from `.venv-vllm`) on the same
checkpoint: the tiny policy with its tied output layer sharpened ×4, so its next-token distributions are
peaked like a trained model's. The same prompts are sampled from each, and every sampled token's log-prob is
recomputed by the trainer's own pass (`response_logprobs`, float32). An fp32 server should agree to float
rounding; a bf16 server is where the gap is real (bf16 weights, bf16 kernels, a bf16 output layer), the gap the
off-policy corrections of TIS, MIS and IcePop are built for, here as the figures to set their thresholds from.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from flows.display import console

DEPENDS_ON = (
    "bench/engine_mismatch.py",
    "policy/vllm_servers.py",
    "infra/vllm/serve.sh",
    "policy/logprobs.py",
    "policy/openai_backend.py",
    "policy/sampling.py",
)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def mismatch_figures(token_deltas: list[list[float]]) -> dict:
    """Figures of server − trainer log-probs, one list per sequence: per token |Δ| (mean and quantiles), the
    per-token ratio exp(trainer − server), the sequence-level log ratio (GSPO's, TIS's at sequence level),
    and the share of tokens and sequences a ratio cap of 2 (or floor of 0.5) would touch."""
    tokens = [delta for sequence in token_deltas for delta in sequence]
    absolute = [abs(delta) for delta in tokens]
    ratios = [math.exp(-delta) for delta in tokens]
    sequences = [-sum(sequence) for sequence in token_deltas if sequence]
    return {
        "tokens": len(tokens),
        "sequences": len(sequences),
        "mean_abs_delta": statistics.fmean(absolute),
        "p50_abs_delta": quantile(absolute, 0.5),
        "p90_abs_delta": quantile(absolute, 0.9),
        "p99_abs_delta": quantile(absolute, 0.99),
        "max_abs_delta": max(absolute),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_std": statistics.pstdev(ratios),
        "tokens_outside_half_to_two": sum(not 0.5 <= r <= 2 for r in ratios) / len(ratios),
        "mean_abs_sequence_log_ratio": statistics.fmean(abs(s) for s in sequences),
        "max_abs_sequence_log_ratio": max(abs(s) for s in sequences),
        "sequences_outside_half_to_two": sum(abs(s) > math.log(2) for s in sequences) / len(sequences),
    }


def sharpened_checkpoint(target: Path, scratch: Path, factor: float = 4.0) -> str:
    """The default tiny policy (built in a lake at `scratch`) with its tied output layer ×`factor`, saved as a
    plain checkpoint folder at `target`: a next-token distribution peaked like a trained model's."""
    import torch

    from policy.checkpoints import load_policy
    from storage.lake import Lake
    from storage.registry import version_row
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

    lake = Lake.open(str(scratch))
    ensure_base_policy(lake, BasePolicyConfig())
    model, tokenizer = load_policy(version_row(lake, 0)["checkpoint_uri"])
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(factor)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)


def sequence_deltas(url: str, model, tokenizer, prompts: list[str], samples: int, max_tokens: int) -> list[list[float]]:
    """Sample `samples` responses to each prompt from one server (as the backend asks), and the server −
    trainer log-prob of every sampled token."""
    import torch

    from policy.logprobs import response_logprobs
    from policy.openai_backend import OpenAIBackendConfig, OpenAIPolicy
    from policy.sampling import SamplerConfig

    sampler = SamplerConfig(max_new_tokens=max_tokens)
    client = OpenAIPolicy(OpenAIBackendConfig(endpoints=[url], model_name="policy", confirm_served=False))
    try:
        groups = client.generate(prompts, samples, sampler, seed=0, model_version=0)
    finally:
        client.close()
    prompt_ids = [tokenizer(prompt, add_special_tokens=False).input_ids for prompt in prompts]
    pairs = [(ids, sample) for ids, group in zip(prompt_ids, groups) for sample in group if sample.token_ids]
    with torch.no_grad():
        recomputed, mask, _ = response_logprobs(model, [ids for ids, _ in pairs], [s.token_ids for _, s in pairs])
    return [
        [served - float(local) for served, local in zip(sample.logprobs, row[keep.bool()])]
        for (_, sample), row, keep in zip(pairs, recomputed, mask)
    ]


def run_benchmark(
    dtypes: tuple[str, ...] = ("float32", "bfloat16"), prompts: int = 16, samples: int = 4, max_tokens: int = 64
) -> dict:
    """Per dtype, the mismatch figures of one server's samples against the fp32 trainer."""
    from policy import vllm_servers
    from policy.checkpoints import load_policy
    from policy.prompts import format_prompt
    from tasks.generators import generate
    from tasks.rollout.stage import RolloutConfig

    with tempfile.TemporaryDirectory(prefix="rlvr-bench-mismatch-") as work:
        folder = sharpened_checkpoint(Path(work) / "base", Path(work) / "lake")
        model, tokenizer = load_policy(folder)
        template = RolloutConfig().prompt
        texts = [
            format_prompt(problem.prompt, template, tokenizer)
            for _, _, problem in generate("mix", count=prompts, seed=0)
        ]
        figures = {}
        for dtype in dtypes:
            server = vllm_servers.serving(
                folder, Path(work) / "logs", vllm_servers.free_port(), WEIGHTS="full", DTYPE=dtype
            )
            try:
                figures[dtype] = mismatch_figures(
                    sequence_deltas(server.url, model, tokenizer, texts, samples, max_tokens)
                )
            finally:
                server.stop()
    for dtype, figure in figures.items():
        console.print(
            f"{dtype} server against the float32 trainer, {figure['tokens']} tokens: mean |Δ log p| "
            f"{figure['mean_abs_delta']:.2e} (p99 {figure['p99_abs_delta']:.2e}, max {figure['max_abs_delta']:.2e}); "
            f"token ratio {figure['ratio_min']:.3f}…{figure['ratio_max']:.3f}; sequence |log ratio| mean "
            f"{figure['mean_abs_sequence_log_ratio']:.3f}, max {figure['max_abs_sequence_log_ratio']:.3f}; "
            f"outside [0.5, 2]: {figure['tokens_outside_half_to_two']:.2%} of tokens, "
            f"{figure['sequences_outside_half_to_two']:.2%} of sequences"
        )
    return {"dtypes": figures, "prompts": prompts, "samples": samples, "max_tokens": max_tokens}
