"""Supervised warm-up: teach the base model the answer format on the bank's worked solutions, and stop
when its sampled solve rate on held-out problems enters a band.

Stopping on a measured band rather than after a fixed time, because the accuracy of a tiny model
jumps suddenly during warm-up, and when it jumps moves with the seed. RL then starts from a policy
that solves some problems but not most: the 20-50 % zone where GRPO's groups carry signal.
The loss is next-token cross-entropy on the solution tokens only (prompt tokens are masked).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import polars as pl
from pydantic import Field

from storage.config import Strict
from storage.progress import track


class WarmupFailed(ValueError):
    """The band was not reached within max_steps."""


class WarmupConfig(Strict):
    """Supervised warm-up before RL; skipped when the lake already holds a warm-up version."""

    enabled: bool = Field(False, description="run the warm-up before the first RL iteration")
    band: tuple[float, float] = Field(
        (0.25, 0.45),
        description="stop once the held-out sampled solve rate "
        "reaches band[0]; a rate above band[1] is recorded as an overshoot",
    )
    max_steps: int = Field(20000, ge=1, description="give up (and fail) after this many optimizer steps")
    batch_size: int = Field(64, ge=1, description="worked solutions per optimizer step")
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate (after a linear warm-up)")
    lr_warmup_steps: int = Field(100, ge=0, description="linear learning-rate warm-up steps")
    evaluate_every: int = Field(100, ge=1, description="steps between held-out evaluations")
    eval_problems: int = Field(200, ge=10, description="held-out problems per evaluation during warm-up")
    max_new_tokens: int = Field(48, ge=1, description="response cap when evaluating")
    seed: int = Field(0, description="seed of batches and evaluation sampling")


def supervised_loss(model, prompts: list[list[int]], targets: list[list[int]]):
    """Mean cross-entropy of the target tokens given the prompt (prompt positions masked)."""
    import torch

    sequences = [p + t for p, t in zip(prompts, targets)]
    width = max(len(s) for s in sequences)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long, device=model.device)  # [B, S]
    labels = torch.full_like(input_ids, -100)  # -100: ignored
    attention = torch.zeros_like(input_ids)
    for row, (prompt, target) in enumerate(zip(prompts, targets)):
        input_ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[row, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
        attention[row, : len(prompt) + len(target)] = 1
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()  # [B, S-1, V]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def warm_up(
    model,
    tokenizer,
    examples: pl.DataFrame,
    config: WarmupConfig,
    solve_rate: Callable[[object], float],
    progress: Callable[[int, float, float | None], None] = lambda *a: None,
) -> dict:
    """Train `model` in place on `examples` (prompt text, target text) until `solve_rate(model)` reaches the band.

    Returns the metrics: steps, final solve rate, the evaluation history, whether it overshot.
    """
    import torch

    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in examples["prompt"]]
    targets = [
        tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for text in examples["target"]
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    rng = random.Random(config.seed)
    history: list[tuple[int, float]] = []
    rate = 0.0
    for step in track(range(1, config.max_steps + 1), "warm-up steps (stops early in the band)"):
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * min(1.0, step / max(config.lr_warmup_steps, 1))
        batch = rng.sample(range(len(prompts)), min(config.batch_size, len(prompts)))
        loss = supervised_loss(model, [prompts[i] for i in batch], [targets[i] for i in batch])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        measured = None
        if step % config.evaluate_every == 0:
            model.eval()
            rate = measured = solve_rate(model)
            history.append((step, rate))
        progress(step, float(loss.detach()), measured)
        if measured is not None and measured >= config.band[0]:
            model.eval()
            return {
                "steps": step,
                "solve_rate": rate,
                "overshoot": rate > config.band[1],
                "history": history,
                "final_loss": float(loss.detach()),
            }
    raise WarmupFailed(
        f"warm-up did not reach a held-out solve rate of {config.band[0]:.0%} in {config.max_steps} "
        f"steps (last {rate:.1%}): raise max_steps or the learning rate, or use easier problems"
    )
