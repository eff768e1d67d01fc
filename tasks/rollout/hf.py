"""The in-process backend: a transformers causal LM sampled by our own loop over its KV cache.

Our own loop rather than `generate`, because each step needs both the raw next-token
distribution (for self-certainty) and the one actually sampled (for behaviour log-probs), and
keeping only per-step statistics costs O(batch × vocabulary) memory instead of O(steps × ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.progress import track
from tasks.rollout.sampling import Sample, SamplerConfig, sampling_logprobs, self_certainty


@dataclass
class HFPolicy:
    """Samples from a loaded (model, tokenizer) pair; `model_version` names what it holds."""

    model: object
    tokenizer: object
    model_version: int
    batch_size: int = 64
    backend: str = field(default="hf")

    def generate(self, prompts: list[str], n: int, sampler: SamplerConfig, seed: int,
                 model_version: int) -> list[list[Sample]]:
        if model_version != self.model_version:
            raise ValueError(f"the hf backend holds model version {self.model_version}, not {model_version}")
        import torch

        encoded = [self.tokenizer(prompt, add_special_tokens=False).input_ids for prompt in prompts]
        rows = [(i, encoded[i]) for i in range(len(prompts)) for _ in range(n)]
        generator = torch.Generator(device=self.model.device).manual_seed(seed % 2**63)
        samples: list[list[Sample]] = [[] for _ in prompts]
        for start in track(range(0, len(rows), self.batch_size), f"sampling {len(rows)} responses"):
            chunk = rows[start:start + self.batch_size]
            for (prompt_index, prompt_ids), sample in zip(chunk, self._sample_batch([ids for _, ids in chunk],
                                                                                    sampler, generator)):
                sample.prompt_token_ids = prompt_ids
                samples[prompt_index].append(sample)
        return samples

    def _sample_batch(self, prompt_ids: list[list[int]], sampler: SamplerConfig, generator) -> list[Sample]:
        import torch

        model, tokenizer = self.model, self.tokenizer
        pad = tokenizer.pad_token_id
        stop_ids = torch.tensor(sorted(stop_token_ids(model, tokenizer)), device=model.device)
        batch, width = len(prompt_ids), max(len(ids) for ids in prompt_ids)
        device = model.device
        input_ids = torch.full((batch, width), pad, dtype=torch.long, device=device)       # [B, P] left-padded
        attention = torch.zeros((batch, width), dtype=torch.long, device=device)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, width - len(ids):] = torch.tensor(ids, device=device)
            attention[row, width - len(ids):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)                                # pads share position 0
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        certainty = torch.zeros(batch, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        with torch.no_grad():
            output = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
            for _ in range(sampler.max_new_tokens):
                logits = output.logits[:, -1].float()                                      # [B, V]
                behaviour = sampling_logprobs(logits, sampler)                             # [B, V]
                if sampler.temperature == 0:
                    token = logits.argmax(-1)
                    token_logprob = torch.zeros(batch, device=device)
                else:
                    token = torch.multinomial(behaviour.exp(), 1, generator=generator).squeeze(-1)   # [B]
                    token_logprob = behaviour.gather(-1, token[:, None]).squeeze(-1)
                certainty += torch.where(finished, 0.0, self_certainty(logits))
                for row in (~finished).nonzero().flatten().tolist():
                    tokens[row].append(int(token[row]))
                    logprobs[row].append(float(token_logprob[row]))
                stopped |= ~finished & torch.isin(token, stop_ids)
                stopped |= ~finished & self._hit_stop_string(tokens, sampler.stop, batch)
                finished |= stopped
                if bool(finished.all()):
                    break
                token = torch.where(finished, pad, token)
                attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=-1)
                positions = positions[:, -1:] + 1
                output = model(input_ids=token[:, None], attention_mask=attention, position_ids=positions,
                               cache=output.cache, use_cache=True)
        return [Sample(text=self._text(tokens[row], sampler.stop), token_ids=tokens[row], logprobs=logprobs[row],
                       finish_reason="stop" if bool(stopped[row]) else "length",
                       self_certainty=float(certainty[row]) / max(len(tokens[row]), 1), backend=self.backend)
                for row in range(batch)]

    def _hit_stop_string(self, tokens: list[list[int]], stop: list[str], batch: int):
        import torch

        if not stop:
            return torch.zeros(batch, dtype=torch.bool, device=self.model.device)
        tail = max(len(s.encode()) for s in stop) + 4               # byte-level: a stop string spans ≤ its bytes
        hits = [any(s in self.tokenizer.decode(ids[-tail:]) for s in stop) for ids in tokens]
        return torch.tensor(hits, device=self.model.device)

    def _text(self, token_ids: list[int], stop: list[str]) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        return text[:cut] if cut >= 0 else text


def stop_token_ids(model, tokenizer) -> set[int]:
    """Tokens that end a response: end-of-text, the generation config's end tokens, and the chat
    template's end-of-turn marker (what vLLM stops on too)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(configured) if isinstance(configured, (list, tuple)) else {configured}
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    return {i for i in ids | {end_of_turn} if i is not None}


def sequence_logprobs(model, prompt_ids: list[list[int]], response_ids: list[list[int]], temperature: float = 1.0):
    """Per-token log-probs of each response under `model` (softmax(logits / temperature)); list of [L_i] tensors.

    With the sampler's defaults they equal the behaviour log-probs the hf backend stored.
    """
    from trainers.logprobs import response_logprobs

    logprobs, _, _ = response_logprobs(model, prompt_ids, response_ids, temperature)
    return [logprobs[row, :len(response)] for row, response in enumerate(response_ids)]
