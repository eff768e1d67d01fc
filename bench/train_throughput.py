"""`rlvr bench train`: training-step throughput (response tokens per second) of our GRPO / DAPO step
against TRL's GRPOTrainer, on the same tiny model and batch shape, in one process.

Both sides get identical batches (prompt and response token ids, behaviour log-probs, advantages)
and do the same work per step: a forward pass over prompt + response, the clipped token-level loss,
backward, gradient clipping and an AdamW step. TRL's side is a real `GRPOTrainer` whose own
`compute_loss` (its log-prob forward and `_compute_loss`) runs; generation is not timed on either side.

In the same run, our step under each rollout correction (`train.rollout_correction.mode`) against the step
without one and without the mismatch record (`train.record_mismatch: false`: the step before either existed),
on behaviour log-probs 0.05 nat a token off the trainer's, as an engine's are: the target is ≤ 5 % slower.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time

import polars as pl
import torch

from policy.logprobs import response_logprobs
from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from tasks.rollout.base_policy import tokenizer_corpus
from trainers.grpo import TrainConfig, train_on_batch

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/train_throughput.py",
    "trainers/grpo.py",
    "trainers/loss.py",
    "trainers/correction.py",
    "trainers/mismatch.py",
    "policy/logprobs.py",
    "policy/tiny.py",
)


CORRECTIONS = ("token_tis", "sequence_mask", "icepop")  # per token, per sequence, and a band


def synthetic_batch(model, tokenizer, sequences: int, prompt_length: int, response_length: int, seed: int = 0):
    """Fixed-length prompts and responses (the batch shape both sides see), on-policy log-probs."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(4, 250, (sequences, prompt_length), generator=generator).tolist()
    responses = torch.randint(4, 250, (sequences, response_length), generator=generator).tolist()
    with torch.no_grad():
        logprobs, _, _ = response_logprobs(model, prompts, responses)
    logprobs = logprobs + 0.05 * torch.randn(logprobs.shape, generator=generator)  # an engine's own rounding
    advantages = torch.randn(sequences, generator=generator)
    return prompts, responses, logprobs, advantages


def trl_trainer(model_dir: str, batch: int, group: int, response_length: int, learning_rate: float):
    import warnings

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    with warnings.catch_warnings():  # transformers deprecates a field TRL's config still sets
        warnings.simplefilter("ignore", FutureWarning)
        args = grpo_config(GRPOConfig, batch, group, response_length, learning_rate)
    dataset = Dataset.from_dict({"prompt": ["1+1="] * batch})
    return GRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=dataset,
    )


def grpo_config(GRPOConfig, batch: int, group: int, response_length: int, learning_rate: float):
    return GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="rlvr-bench-trl-"),
        per_device_train_batch_size=batch,
        num_generations=group,
        max_completion_length=response_length,
        learning_rate=learning_rate,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        use_cpu=True,
        report_to=[],
        logging_steps=10**9,
        save_strategy="no",
        max_grad_norm=1.0,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
    )  # as ours: no recomputation in the backward pass


def trl_step(trainer, prompts, responses, logprobs, advantages) -> None:
    model = trainer.model
    inputs = {
        "prompt_ids": torch.tensor(prompts),
        "prompt_mask": torch.ones(len(prompts), len(prompts[0]), dtype=torch.long),
        "completion_ids": torch.tensor(responses),
        "completion_mask": torch.ones(len(responses), len(responses[0]), dtype=torch.long),
        "advantages": advantages,
        "old_per_token_logps": logprobs,
        "num_items_in_batch": torch.tensor(float(len(responses) * len(responses[0]))),
    }
    trainer.optimizer.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    trainer.accelerator.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    trainer.optimizer.step()


def run_benchmark(
    sequences: int = 128, group: int = 8, prompt_length: int = 16, response_length: int = 40, repeats: int = 5
) -> dict:
    from rich.console import Console

    torch.manual_seed(0)
    tokenizer = train_tokenizer(tokenizer_corpus(count=200))
    model = build_model(TinyModelConfig(), tokenizer)
    folder = tempfile.mkdtemp(prefix="rlvr-bench-model-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompts, responses, logprobs, advantages = synthetic_batch(
        model, tokenizer, sequences, prompt_length, response_length
    )
    rows = pl.DataFrame(
        {
            "prompt_token_ids": prompts,
            "response_token_ids": responses,
            "behaviour_logprobs": logprobs.tolist(),
            "advantage": advantages.tolist(),
            "weight": [1.0] * sequences,
            "temperature": [1.0] * sequences,
        }
    )
    variants = {  # our step: as configured by default, as before the correction existed, under each correction
        "ours": TrainConfig(micro_batch_size=sequences, learning_rate=1e-4),
        "baseline": TrainConfig(micro_batch_size=sequences, learning_rate=1e-4, record_mismatch=False),
        **{
            mode: TrainConfig(micro_batch_size=sequences, learning_rate=1e-4, rollout_correction={"mode": mode})
            for mode in CORRECTIONS
        },
    }
    models = {name: copy.deepcopy(model) for name in variants}
    trainer = trl_trainer(folder, sequences, group, response_length, 1e-4)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we drive single steps ourselves
    trainer.model.train()
    tokens = sequences * response_length
    times = {name: [] for name in [*variants, "trl"]}
    states = dict.fromkeys(variants)
    names = list(variants)
    for round in range(repeats + 1):  # the first round of each side is a warm-up, not timed; sides interleaved
        for name in names[round % len(names) :] + names[: round % len(names)]:  # each first in turn
            config = variants[name]
            started = time.perf_counter()
            _, states[name] = train_on_batch(models[name], rows, config, states[name])
            times[name].append(time.perf_counter() - started)
        started = time.perf_counter()
        trl_step(trainer, prompts, responses, logprobs, advantages)
        times["trl"].append(time.perf_counter() - started)
    median = {name: statistics.median(values[1:]) for name, values in times.items()}
    ours, theirs = median["ours"], median["trl"]
    result = {
        "tokens_per_step": tokens,
        "ours_tokens_per_second": tokens / ours,
        "trl_tokens_per_second": tokens / theirs,
        "ratio": theirs / ours,
        "baseline_tokens_per_second": tokens / median["baseline"],
        "slowdown": {name: median[name] / median["baseline"] for name in ["ours", *CORRECTIONS]},
    }
    result["max_slowdown"] = max(result["slowdown"].values())
    slowdowns = ", ".join(f"{name} ×{value:.3f}" for name, value in result["slowdown"].items())
    Console().print(
        f"{sequences} sequences × {response_length} response tokens (prompts {prompt_length}), "
        f"median of {repeats}: ours {result['ours_tokens_per_second']:,.0f} tokens/s, TRL GRPOTrainer "
        f"{result['trl_tokens_per_second']:,.0f} tokens/s — ×{result['ratio']:.2f}\n"
        f"step time against the step without correction or mismatch record: {slowdowns} (target ≤ ×1.05)"
    )
    return result
