"""Per-token log-probs (and entropies) of responses under a model: the one forward pass the trainer,
importance weights and the behaviour-log-prob checks all share; and INTUITOR's self-certainty of
responses from the same pass, for backends that do not report it."""

from __future__ import annotations

import torch

from policy.sampling import self_certainty


def _response_logits(model, prompt_ids: list[list[int]], response_ids: list[list[int]], share_prompts: bool = False):
    """The logits that predict each response token, right-padded: (logits [B, T, V], targets [B, T], mask [B, T]).
    `share_prompts`: rows that repeat a prompt (a group's) forward it once (`_shared_prompt_logits`)."""
    if any(not prompt for prompt in prompt_ids):
        raise ValueError("a response needs a non-empty prompt to be scored (its first token is predicted from it)")
    if share_prompts:
        shared = _shared_prompt_logits(model, prompt_ids, response_ids)
        if shared is not None:
            return shared
    sequences = [p + r for p, r in zip(prompt_ids, response_ids)]
    width = max(len(s) for s in sequences)
    longest = max(len(r) for r in response_ids)
    device = model.device if hasattr(model, "device") else next(model.parameters()).device  # DDP: no .device
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long, device=device)  # [B, S] right-padded
    attention = torch.zeros_like(input_ids)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence, device=device)
        attention[row, : len(sequence)] = 1
    logits = model(input_ids=input_ids, attention_mask=attention).logits.float()  # [B, S, V]
    # position j predicts token j + 1: response token k of row i sits at len(prompt_i) + k
    starts = torch.tensor([len(p) for p in prompt_ids], device=device)
    offsets = torch.arange(longest, device=device)
    positions = (starts[:, None] - 1 + offsets[None, :]).clamp(max=width - 2)  # [B, T]
    mask = (offsets[None, :] < torch.tensor([len(r) for r in response_ids], device=device)[:, None]).float()
    picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    targets = input_ids.gather(1, (positions + 1).clamp(max=width - 1))  # [B, T]
    return picked, targets, mask


def shared_prefill(prompt_ids: list[list[int]], device):
    """(rows to prefill, and the index that spreads their KV cache over the batch) when rows repeat a prompt, as a
    group's G rows do; (every row, None) when none repeats. A prompt's KV cache is the same in each row that
    holds it (causal attention: the prompt never sees the response), so computing it once per prompt leaves
    the samples as they were and saves (G − 1) / G of the prefill."""
    slots: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    spread = []
    for row, ids in enumerate(prompt_ids):
        key = tuple(ids)
        if key not in slots:
            slots[key] = len(firsts)
            firsts.append(row)
        spread.append(slots[key])
    if len(firsts) == len(prompt_ids):
        return torch.arange(len(prompt_ids), device=device), None
    return torch.tensor(firsts, device=device), torch.tensor(spread, device=device)


def right_padded(rows: list[list[float]], width: int | None = None, device=None, dtype=torch.float32):
    """The rows' values right-padded with zeros to `width` (default: the longest, at least 1), and the mask of
    where values are: ([B, W], [B, W])."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    flat = torch.tensor([value for row in rows for value in row], dtype=dtype)
    values, mask = padded_spans(flat, lengths.cumsum(0) - lengths, lengths, width)
    return values.to(device), mask.to(device)


def padded_spans(flat: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int | None = None):
    """Row i is flat[starts[i] : starts[i] + lengths[i]], right-padded with zeros to `width` (default: the
    longest, at least 1); with the mask of where values are, in `flat`'s dtype: one gather, no Python per row."""
    if width is None:
        width = max(int(lengths.max()) if len(lengths) else 0, 1)
    columns = torch.arange(width)
    inside = columns[None, :] < lengths[:, None]  # [B, W]
    if flat.numel() == 0:
        return torch.zeros(inside.shape, dtype=flat.dtype), inside.to(flat.dtype)
    values = torch.where(inside, flat[torch.where(inside, starts[:, None] + columns[None, :], 0)], 0)
    return values.to(flat.dtype), inside.to(flat.dtype)


def left_padded_prompts(prompt_ids: list[list[int]], pad: int, device):
    """The prompts as the sampler lays them out, left-padded to the longest: (ids [B, P], attention [B, P],
    positions [B, P]); pads attend to nothing and share position 0, so each prompt's last token sits at P − 1
    and a response's tokens follow at the same positions in every row."""
    batch, width = len(prompt_ids), max(len(ids) for ids in prompt_ids)
    ids = torch.full((batch, width), pad, dtype=torch.long, device=device)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompt_ids):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, device=device)
        attention[row, width - len(prompt) :] = 1
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def kv_cache_field(output) -> str:
    """The name under which this transformers passes the KV cache in and out of a forward: `cache` since 5.24,
    `past_key_values` before (a GPU image's transformers is often older than ours). Read off the output, not
    the forward's signature, so a wrapped model (peft) answers the same; a cache passed under the other name
    would be swallowed by `**kwargs` and every step would see one token without its context."""
    for name in ("cache", "past_key_values"):
        if output.get(name) is not None:
            return name
    raise RuntimeError(
        "the model returned no KV cache with use_cache=True: the hf sampler decodes on one, and a "
        "training pass that shares a group's prompt spreads one"
    )


# Model classes whose KV cache cannot be spread over rows (no `batch_select_indices`): learnt from one forward.
_UNSPREADABLE: set[type] = set()


def _shared_prompt_logits(model, prompt_ids: list[list[int]], response_ids: list[list[int]]):
    """`_response_logits` with each distinct prompt forwarded once: its KV cache, and the logits of its last
    position (which predict the first response token), spread over the rows that repeat it, then the
    responses forwarded on top of that cache. Gradients flow back through the spread to the one prompt pass,
    so a group's G rows cost one prompt and G responses instead of G of each. The prompts are left-padded,
    as the sampler lays them out. None where no prompt repeats, no response has a token, or the model's cache
    cannot be spread."""
    longest = max(len(r) for r in response_ids)
    device = model.device if hasattr(model, "device") else next(model.parameters()).device
    prefill, spread = shared_prefill(prompt_ids, device)
    if spread is None or longest == 0 or type(model) in _UNSPREADABLE:
        return None
    prompts, prompt_attention, positions = left_padded_prompts(prompt_ids, 0, device)  # [B, P] each
    responses = torch.zeros((len(prompt_ids), longest), dtype=torch.long, device=device)  # [B, T] right-padded
    for row, response in enumerate(response_ids):
        responses[row, : len(response)] = torch.tensor(response, device=device)
    prompt_lengths = torch.tensor([len(p) for p in prompt_ids], device=device)
    offsets = torch.arange(longest, device=device)
    mask = offsets[None, :] < torch.tensor([len(r) for r in response_ids], device=device)[:, None]  # [B, T]
    attention = torch.cat([prompt_attention, mask.long()], dim=1)  # [B, P + T]
    out = model(
        input_ids=prompts[prefill],
        attention_mask=prompt_attention[prefill],
        position_ids=positions[prefill],
        use_cache=True,
        logits_to_keep=1,
    )
    field = kv_cache_field(out)
    if not hasattr(out[field], "batch_select_indices"):
        _UNSPREADABLE.add(type(model))  # known now: the next batches skip the wasted prompt pass
        return None
    out[field].batch_select_indices(spread)
    first = out.logits[:, -1][spread]  # [B, V]: token 0
    rest = model(
        input_ids=responses,
        attention_mask=attention,
        position_ids=prompt_lengths[:, None] + offsets[None, :],
        use_cache=True,
        **{field: out[field]},
    ).logits  # [B, T, V]: token k+1
    logits = torch.cat([first[:, None], rest[:, :-1]], dim=1).float()  # [B, T, V]
    return logits, responses, mask.float()


def response_logprobs(
    model,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = False,
):
    """Log-probs of each response token under softmax(logits / temperature), right-padded; `share_prompts`
    forwards a prompt that rows repeat once (not under DDP or FSDP: their forward is one per backward).

    Returns (logprobs [B, T], mask [B, T], entropy [B, T] or None), T the longest response.
    """
    logits, targets, mask = _response_logits(model, prompt_ids, response_ids, share_prompts)
    log_softmax = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
    logprobs = log_softmax.gather(-1, targets[..., None]).squeeze(-1) * mask  # [B, T]
    entropy = None
    if with_entropy:
        detached = log_softmax.detach()  # a statistic only
        entropy = -(detached.exp() * detached).sum(-1) * mask  # [B, T]
    return logprobs, mask, entropy


def response_self_certainty(model, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[float]:
    """Each response's self-certainty: the mean over its tokens of KL(uniform ‖ softmax(logits)) of the raw
    (temperature-1) distribution that predicted it, as the hf backend accumulates it while sampling. An empty
    response has 0."""

    if not any(response_ids):
        return [0.0] * len(response_ids)
    with torch.no_grad():  # a statistic only
        logits, _, mask = _response_logits(model, prompt_ids, [r or [0] for r in response_ids])
        per_token = self_certainty(logits) * mask  # [B, T]
    return [float(per_token[row].sum()) / len(r) if r else 0.0 for row, r in enumerate(response_ids)]
