"""The log-prob agreement gate: do a server's behaviour log-probs equal what the trainer recomputes?

Every importance ratio the trainer forms is exp(its log-prob − the behaviour log-prob the server
returned). Before any update that ratio must be 1; a server that applies penalties the request did not
ask for, samples in another dtype, tokenizes the prompt otherwise (a second BOS) or holds other weights
than the registry's checkpoint breaks it silently. The gate samples a few responses from one endpoint,
recomputes their log-probs with the trainer's own pass (`policy/logprobs.py`, softmax(logits / T))
over the prompt as the hf backend tokenizes it, and measures the gap per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from policy.endpoints import server_root
from policy.logprobs import response_logprobs
from policy.openai_backend import OpenAIBackendConfig, OpenAIPolicy, RequestRefused
from policy.sampling import Sample, SamplerConfig


@dataclass
class Agreement:
    """How one endpoint's behaviour log-probs of one model version compare with the trainer's."""

    endpoint: str
    served_name: str
    model_version: int
    tokens: int  # response tokens compared
    mean_abs_delta: float  # mean over tokens of |server log p − trainer log p|
    max_abs_delta: float
    ratio_min: float  # exp(trainer − server): the importance ratio before any update
    ratio_max: float
    ratio_std: float
    prompt_tokens_match: bool  # the server conditioned on the prompt ids the hf backend would
    tolerance: float
    passed: bool
    causes: list[str] = field(default_factory=list)  # the likely causes, when it failed

    def as_row(self) -> dict:
        return asdict(self)


def measure(
    samples: list[list[Sample]],
    local_prompt_ids: list[list[int]],
    model,
    sampler: SamplerConfig,
    tolerance: float,
    endpoint: str = "",
    served_name: str = "",
    model_version: int = -1,
) -> Agreement:
    """Compare the groups an endpoint sampled (one per prompt) with the trainer's recomputation on `model`."""
    import torch

    pairs = [
        (prompt, sample) for prompt, group in zip(local_prompt_ids, samples) for sample in group if sample.token_ids
    ]
    if not pairs:
        raise ValueError(f"{endpoint}: every sampled response is empty; nothing to compare")
    with torch.no_grad():
        recomputed, mask, _ = response_logprobs(
            model,
            [prompt for prompt, _ in pairs],
            [sample.token_ids for _, sample in pairs],
            sampler.temperature or 1.0,
        )
    served = torch.zeros_like(recomputed)
    seen = torch.zeros_like(mask, dtype=torch.bool)  # the token appeared before: in the prompt or the response
    for row, (prompt, sample) in enumerate(pairs):
        served[row, : len(sample.logprobs)] = torch.tensor(sample.logprobs, dtype=served.dtype)
        history = set(prompt)
        for position, token in enumerate(sample.token_ids):
            seen[row, position] = token in history
            history.add(token)
    mask = mask.bool()
    delta = (served - recomputed.float().cpu())[mask]  # server − trainer, one value a token
    ratio = torch.exp(-delta)
    matches = all(sample.prompt_token_ids in (None, prompt) for prompt, sample in pairs)
    mean_abs = float(delta.abs().mean())
    passed = mean_abs <= tolerance and matches
    causes = [] if passed else likely_causes(delta, seen[mask], pairs, sampler, matches, tolerance)
    return Agreement(
        endpoint,
        served_name,
        model_version,
        int(delta.numel()),
        mean_abs,
        float(delta.abs().max()),
        float(ratio.min()),
        float(ratio.max()),
        float(ratio.std()) if delta.numel() > 1 else 0.0,
        matches,
        tolerance,
        passed,
        causes,
    )


def likely_causes(delta, seen, pairs, sampler: SamplerConfig, prompt_tokens_match: bool, tolerance: float) -> list[str]:
    """Name what most likely makes the server's log-probs differ, most specific first."""
    causes = []
    if not prompt_tokens_match:
        prompt, sample = next((p, s) for p, s in pairs if s.prompt_token_ids not in (None, p))
        twice = len(sample.prompt_token_ids) == len(prompt) + 1 and sample.prompt_token_ids[1:] == prompt
        causes.append(
            "template or BOS: the server conditioned on other prompt tokens than the hf backend "
            + (
                "(a BOS added in front of the template's own: send add_special_tokens false)"
                if twice
                else f"({sample.prompt_token_ids[:8]}… against {prompt[:8]}…)"
            )
        )
    if seen.any() and (~seen).any():
        on_seen, on_new = float(delta[seen].mean()), float(delta[~seen].mean())
        if on_seen < on_new - tolerance:
            causes.append(
                f"server-side penalties: tokens already seen get {on_seen - on_new:+.3f} log p against new "
                "ones (a repetition, presence or frequency penalty the request did not ask for: vLLM takes "
                "omitted ones from generation_config.json, start it with --generation-config vllm)"
            )
    if sampler.top_k or sampler.top_p < 1:
        causes.append(
            "top-k / top-p truncation: the server returns log-probs of the truncated distribution, the "
            "trainer recomputes softmax(logits / T) (set top_k 0 and top_p 1)"
        )
    causes.append(
        "dtype or kernels (a bfloat16 server against a float32 recomputation), or the server holds other "
        "weights than the registry's checkpoint (a stale or failed publish)"
    )
    return causes


class GateFailed(RequestRefused):
    """An endpoint's behaviour log-probs are too far from the trainer's: training on them would be wrong (and
    asking again would not help, so the loop does not retry it)."""


def check_endpoint(
    config: OpenAIBackendConfig,
    endpoint: str,
    served_name: str,
    model_version: int,
    model,
    tokenizer,
    prompts: list[str],
    sampler: SamplerConfig,
    tolerance: float,
    api_key: str | None = None,
    samples_per_prompt: int = 2,
    max_new_tokens: int = 48,
) -> Agreement:
    """Sample `samples_per_prompt` short responses to each prompt from one endpoint, and measure them."""
    short = sampler.model_copy(update={"max_new_tokens": min(sampler.max_new_tokens, max_new_tokens)})
    one = config.model_copy(update={"endpoints": [server_root(endpoint)], "max_retries": min(config.max_retries, 2)})
    client = OpenAIPolicy(one, api_key, {model_version: served_name})
    try:
        groups = client.generate(prompts, samples_per_prompt, short, seed=0, model_version=model_version)
    finally:
        client.close()
    local = [tokenizer(prompt, add_special_tokens=False).input_ids for prompt in prompts]
    return measure(groups, local, model, short, tolerance, endpoint, served_name, model_version)


def describe(agreement: Agreement) -> str:
    """One line for a log: the figures, and the causes when it failed."""
    figures = (
        f"mean |Δ log p| {agreement.mean_abs_delta:.4f} (tolerance {agreement.tolerance}), max "
        f"{agreement.max_abs_delta:.4f}, ratio {agreement.ratio_min:.3f}…{agreement.ratio_max:.3f} over "
        f"{agreement.tokens} tokens"
    )
    verdict = "agrees" if agreement.passed else "DISAGREES; likely: " + "; ".join(agreement.causes)
    return f"{agreement.endpoint} model {agreement.served_name!r}: {figures}: {verdict}"
