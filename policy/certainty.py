"""Self-certainty for backends that do not report it (the `openai` backend: vLLM returns the sampled
tokens' log-probs, not whole next-token distributions).

INTUITOR's self-certainty of a response is the mean over its tokens of KL(uniform ‖ p), p the model's
whole next-token distribution; the hf backend accumulates it while sampling. For a served policy it
is recomputed exactly, from one forward pass of the local copy of the same model version (the
trainer's checkpoint the server loaded) over prompt and response, after the samples come back. Top-k
log-probs from the server would only approximate it (the tail of the distribution is unseen), so they
are not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policy.sampling import Policy, Sample, SamplerConfig
from storage.progress import track


@dataclass
class WithSelfCertainty:
    """A policy whose samples all carry self-certainty: missing values filled from `model` (the local copy)."""

    policy: Policy
    model: object
    tokenizer: object
    batch_size: int = 64
    filled: int = field(default=0, init=False)  # samples whose value this wrapper computed

    def generate(
        self, prompts: list[str], n: int, sampler: SamplerConfig, seed: int, model_version: int
    ) -> list[list[Sample]]:
        from policy.logprobs import response_self_certainty  # lazy: torch

        groups = self.policy.generate(prompts, n, sampler, seed, model_version)
        missing = [
            (prompt, sample)
            for prompt, group in zip(prompts, groups)
            for sample in group
            if sample.self_certainty is None
        ]
        for sample_prompt, sample in missing:
            if not sample.prompt_token_ids:
                sample.prompt_token_ids = self.tokenizer(sample_prompt, add_special_tokens=False).input_ids
        for start in track(range(0, len(missing), self.batch_size), f"self-certainty of {len(missing)} responses"):
            chunk = [sample for _, sample in missing[start : start + self.batch_size]]
            values = response_self_certainty(
                self.model, [s.prompt_token_ids for s in chunk], [s.token_ids for s in chunk]
            )
            for sample, value in zip(chunk, values):
                sample.self_certainty = value
        self.filled += len(missing)
        return groups

    def close(self) -> None:
        getattr(self.policy, "close", lambda: None)()
