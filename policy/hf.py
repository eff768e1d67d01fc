"""The in-process backend: a transformers causal LM sampled by our own loop over its KV cache.

Our own loop rather than `generate`, because each step needs both the raw next-token
distribution (for self-certainty) and the one actually sampled (for behaviour log-probs), and
keeping only per-step statistics costs O(batch × vocabulary) memory instead of O(steps × ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policy.sampling import NO_PENALTIES, Penalties, Sample, SamplerConfig, sampling_logprobs, self_certainty
from storage.progress import track

# The model's batch drops its finished rows once they are 1/NARROW_AT of it: the remaining rows' KV cache is
# copied out then, so narrowing on every finish would cost more than carrying a few padded rows.
NARROW_AT = 8


@dataclass
class HFPolicy:
    """Samples from a loaded (model, tokenizer) pair; `model_version` names what it holds."""

    model: object
    tokenizer: object
    model_version: int
    batch_size: int = 64
    backend: str = field(default="hf")

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        n: int,
        sampler: SamplerConfig,
        seed: int,
        model_version: int,
        penalties: Penalties = NO_PENALTIES,
    ) -> list[list[Sample]]:
        """`penalties`: only `rlvr policy serve` asks for any (what a vLLM request may ask); the platform never."""
        if model_version != self.model_version:
            raise ValueError(f"the hf backend holds model version {self.model_version}, not {model_version}")
        import torch

        encoded = [
            list(prompt) if isinstance(prompt, list) else self.tokenizer(prompt, add_special_tokens=False).input_ids
            for prompt in prompts
        ]  # token ids continue an episode exactly (episodes.py)
        rows = [(i, encoded[i]) for i in range(len(prompts)) for _ in range(n)]
        generator = torch.Generator(device=self.model.device).manual_seed(seed % 2**63)
        samples: list[list[Sample]] = [[] for _ in prompts]
        for start in track(range(0, len(rows), self.batch_size), f"sampling {len(rows)} responses"):
            chunk = rows[start : start + self.batch_size]
            for (prompt_index, prompt_ids), sample in zip(
                chunk, self._sample_batch([ids for _, ids in chunk], sampler, generator, penalties)
            ):
                sample.prompt_token_ids = prompt_ids
                samples[prompt_index].append(sample)
        return samples

    def _sample_batch(
        self, prompt_ids: list[list[int]], sampler: SamplerConfig, generator, penalties: Penalties = NO_PENALTIES
    ) -> list[Sample]:
        import torch

        from policy.logprobs import kv_cache_field, left_padded_prompts, shared_prefill  # lazy: torch

        model, tokenizer = self.model, self.tokenizer
        pad = tokenizer.pad_token_id
        stop_ids = torch.tensor(sorted(stop_token_ids(model, tokenizer)), device=model.device)
        device = model.device
        steps = sampler.max_new_tokens
        input_ids, prompt_attention, positions = left_padded_prompts(prompt_ids, pad, device)  # [B, P] each
        batch, width = input_ids.shape
        attention = torch.ones((batch, width + steps), dtype=torch.long, device=device)  # [B, P + T], sliced per step
        attention[:, :width] = prompt_attention
        neutral = penalties.neutral  # asked once, not per step
        plain = sampler.top_k == 0 and sampler.top_p >= 1.0 and sampler.temperature == 1.0 and neutral
        if not neutral:  # [B, V] each
            vocabulary = model.get_output_embeddings().weight.shape[0]
            in_prompt = (
                torch.zeros((batch, vocabulary), dtype=torch.long, device=device).scatter_add_(
                    1, input_ids, attention[:, :width]
                )
                > 0
            )  # pads count for nothing
            output_counts = torch.zeros((batch, vocabulary), device=device)
        tokens = torch.full((batch, steps), pad, dtype=torch.long, device=device)  # [B, T] filled per step
        logprobs = torch.zeros((batch, steps), device=device)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)  # tokens kept per row
        certainty = torch.zeros(batch, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        # The model's batch holds the rows still sampling: `rows` are their indices in [B], `done` marks the
        # ones that finished since the batch was last narrowed (they ride along, padded, until then).
        rows = torch.arange(batch, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        used = 0
        with torch.no_grad():
            # a group's rows share one prompt: it is prefilled once and its KV cache copied to the others
            # (`shared_prefill`); the prompt's last position only: logits for every prompt token would cost B × P × V
            prefill, spread = shared_prefill(prompt_ids, device)
            output = model(
                input_ids=input_ids[prefill],
                attention_mask=attention[prefill, :width],
                position_ids=positions[prefill],
                use_cache=True,
                logits_to_keep=1,
            )
            cache_field = kv_cache_field(output)
            last = output.logits[:, -1]  # [b, V]
            if spread is not None:
                if hasattr(output[cache_field], "batch_select_indices"):
                    output[cache_field].batch_select_indices(spread)
                    last = last[spread]
                else:  # a cache that cannot be copied: prefill every row
                    output = model(
                        input_ids=input_ids,
                        attention_mask=attention[:, :width],
                        position_ids=positions,
                        use_cache=True,
                        logits_to_keep=1,
                    )
                    last = output.logits[:, -1]
            for step in range(steps):
                logits = last.float()  # [b, V]
                raw = torch.log_softmax(logits, dim=-1)
                adjusted = logits if neutral else penalties.penalise(logits, in_prompt, output_counts)
                behaviour = raw if plain else sampling_logprobs(adjusted, sampler, penalties.min_p)  # [b, V]
                if sampler.temperature == 0:
                    token = adjusted.argmax(-1)
                    token_logprob = torch.zeros(len(rows), device=device)
                else:
                    token = torch.multinomial(behaviour.exp(), 1, generator=generator).squeeze(-1)  # [b]
                    token_logprob = behaviour.gather(-1, token[:, None]).squeeze(-1)
                alive = ~done
                if not neutral:
                    output_counts[torch.arange(len(rows), device=device), token] += alive
                tokens[rows, step] = torch.where(done, pad, token)  # past a row's length: never read
                logprobs[rows, step] = token_logprob
                lengths[rows] += alive
                used = step + 1
                certainty[rows] += torch.where(done, 0.0, self_certainty(logits, raw))
                ends = alive & torch.isin(token, stop_ids)
                if sampler.stop:
                    live = torch.zeros(batch, dtype=torch.bool, device=device).index_put_((rows,), alive)
                    ends |= alive & self._hit_stop_string(tokens[:, :used], lengths, live, sampler.stop)[rows]
                stopped[rows] |= ends
                done |= ends
                finished = int(done.sum())  # the one host sync a step
                if used == steps or finished == len(rows):  # no forward past the cap
                    break
                token = torch.where(done, pad, token)
                positions = positions[:, -1:] + 1
                if finished * NARROW_AT >= len(rows) and hasattr(output[cache_field], "batch_select_indices"):
                    keep = (~done).nonzero().flatten()  # drop the finished rows' compute
                    output[cache_field].batch_select_indices(keep)
                    rows, token, positions, attention = rows[keep], token[keep], positions[keep], attention[keep]
                    done = done[keep]
                    if not neutral:
                        in_prompt, output_counts = in_prompt[keep], output_counts[keep]
                output = model(
                    input_ids=token[:, None],
                    attention_mask=attention[:, : width + step + 1],
                    position_ids=positions,
                    use_cache=True,
                    **{cache_field: output[cache_field]},
                )
                last = output.logits[:, -1]
        kept = lengths.tolist()  # one transfer for the whole batch, not one per token
        token_rows, logprob_rows = tokens[:, :used].tolist(), logprobs[:, :used].tolist()
        ended, certainties = stopped.tolist(), certainty.tolist()
        ids = [token_rows[row][: kept[row]] for row in range(batch)]
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)  # one call for the batch, not one a row
        return [
            Sample(
                text=_cut(text, sampler.stop),
                token_ids=ids[row],
                logprobs=logprob_rows[row][: kept[row]],
                finish_reason="stop" if ended[row] else "length",
                self_certainty=certainties[row] / max(kept[row], 1),
                backend=self.backend,
            )
            for row, text in enumerate(texts)
        ]

    def _hit_stop_string(self, tokens, lengths, alive, stop: list[str]):
        """Rows (among the `alive` ones) whose text now ends in a stop string: only the last few tokens of
        each live row are decoded, in one batch call."""
        import torch

        tail = max(len(s.encode()) for s in stop) + 4  # byte-level: a stop string spans ≤ its bytes
        rows = alive.nonzero().flatten().tolist()
        ends = lengths.tolist()
        texts = self.tokenizer.batch_decode(
            [tokens[row, max(0, ends[row] - tail) : ends[row]].tolist() for row in rows]
        )
        hits = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for row, text in zip(rows, texts):
            hits[row] = any(s in text for s in stop)
        return hits


def _cut(text: str, stop: list[str]) -> str:
    """The text before its first stop string."""
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
    from policy.logprobs import response_logprobs  # lazy: torch

    logprobs, _, _ = response_logprobs(model, prompt_ids, response_ids, temperature)
    return [logprobs[row, : len(response)] for row, response in enumerate(response_ids)]
