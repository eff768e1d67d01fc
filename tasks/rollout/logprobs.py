"""Per-token log-probs (and entropies) of responses under a model: the one forward pass the trainer,
importance weights and the behaviour-log-prob checks all share; and INTUITOR's self-certainty of
responses from the same pass, for backends that do not report it."""

from __future__ import annotations

import torch


def _response_logits(model, prompt_ids: list[list[int]], response_ids: list[list[int]]):
    """The logits that predict each response token, right-padded: (logits [B, T, V], targets [B, T], mask [B, T])."""
    if any(not prompt for prompt in prompt_ids):
        raise ValueError("a response needs a non-empty prompt to be scored (its first token is predicted from it)")
    sequences = [p + r for p, r in zip(prompt_ids, response_ids)]
    width = max(len(s) for s in sequences)
    longest = max(len(r) for r in response_ids)
    device = model.device if hasattr(model, "device") else next(model.parameters()).device   # DDP: no .device
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long, device=device)        # [B, S] right-padded
    attention = torch.zeros_like(input_ids)
    for row, sequence in enumerate(sequences):
        input_ids[row, :len(sequence)] = torch.tensor(sequence, device=device)
        attention[row, :len(sequence)] = 1
    logits = model(input_ids=input_ids, attention_mask=attention).logits.float()              # [B, S, V]
    # position j predicts token j + 1: response token k of row i sits at len(prompt_i) + k
    starts = torch.tensor([len(p) for p in prompt_ids], device=device)
    offsets = torch.arange(longest, device=device)
    positions = (starts[:, None] - 1 + offsets[None, :]).clamp(max=width - 2)                  # [B, T]
    mask = (offsets[None, :] < torch.tensor([len(r) for r in response_ids], device=device)[:, None]).float()
    picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))           # [B, T, V]
    targets = input_ids.gather(1, (positions + 1).clamp(max=width - 1))                        # [B, T]
    return picked, targets, mask


def response_logprobs(model, prompt_ids: list[list[int]], response_ids: list[list[int]], temperature: float = 1.0,
                      with_entropy: bool = False):
    """Log-probs of each response token under softmax(logits / temperature), right-padded.

    Returns (logprobs [B, T], mask [B, T], entropy [B, T] or None), T the longest response.
    """
    logits, targets, mask = _response_logits(model, prompt_ids, response_ids)
    log_softmax = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
    logprobs = log_softmax.gather(-1, targets[..., None]).squeeze(-1) * mask                   # [B, T]
    entropy = None
    if with_entropy:
        detached = log_softmax.detach()                                                        # a statistic only
        entropy = -(detached.exp() * detached).sum(-1) * mask                                  # [B, T]
    return logprobs, mask, entropy


def response_self_certainty(model, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[float]:
    """Each response's self-certainty: the mean over its tokens of KL(uniform ‖ softmax(logits)) of the raw
    (temperature-1) distribution that predicted it, as the hf backend accumulates it while sampling. An empty
    response has 0."""
    from tasks.rollout.sampling import self_certainty

    if not any(response_ids):
        return [0.0] * len(response_ids)
    with torch.no_grad():                                                                      # a statistic only
        logits, _, mask = _response_logits(model, prompt_ids, [r or [0] for r in response_ids])
        per_token = self_certainty(logits) * mask                                              # [B, T]
    return [float(per_token[row].sum()) / len(r) if r else 0.0 for row, r in enumerate(response_ids)]
