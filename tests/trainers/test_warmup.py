"""The supervised warm-up: a loss on solution tokens only, a stop on the measured held-out band,
a clear failure when the band is never reached, and a warm-up version the next run starts from."""

import math

import pytest
import torch

from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from tasks.rollout.base_policy import tokenizer_corpus
from trainers.warmup import WarmupConfig, WarmupFailed, supervised_loss, warm_up

SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(tokenizer_corpus(count=50))
    return build_model(SMALL, tokenizer), tokenizer


def test_the_loss_counts_solution_tokens_only(policy):
    model, _ = policy
    prompts, targets = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    loss = supervised_loss(model, prompts, targets)
    with torch.no_grad():
        total, count = 0.0, 0
        for prompt, target in zip(prompts, targets):
            logits = model(input_ids=torch.tensor([prompt + target])).logits[0].float()
            for k, token in enumerate(target):
                total -= torch.log_softmax(logits[len(prompt) + k - 1], -1)[token].item()
                count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)


def test_warm_up_stops_at_the_band_and_fails_clearly_without_it(policy):
    import copy

    import polars as pl

    model, tokenizer = policy
    examples = pl.DataFrame({"prompt": ["1+1=", "2+2="], "target": ["2", "4"]})
    rates = iter([0.1, 0.2, 0.3])
    metrics = warm_up(
        copy.deepcopy(model),
        tokenizer,
        examples,
        WarmupConfig(evaluate_every=5, band=(0.25, 0.45)),
        lambda current: next(rates),
    )
    assert metrics["steps"] == 15 and metrics["solve_rate"] == 0.3 and not metrics["overshoot"]
    assert [step for step, _ in metrics["history"]] == [5, 10, 15]
    with pytest.raises(WarmupFailed, match="did not reach a held-out solve rate of 99% in 6 steps"):
        warm_up(
            copy.deepcopy(model),
            tokenizer,
            examples,
            WarmupConfig(evaluate_every=3, max_steps=6, band=(0.99, 1.0)),
            lambda current: 0.0,
        )


def test_warm_up_learns_the_examples(policy):
    import copy

    import polars as pl

    model, tokenizer = policy
    examples = pl.DataFrame({"prompt": ["What is 2*3+1?\n"] * 4, "target": ["2*3 = 6\n6+1 = 7\n#### 7"] * 4})
    trained = copy.deepcopy(model)
    prompts = [tokenizer(examples["prompt"][0]).input_ids]
    targets = [tokenizer(examples["target"][0]).input_ids + [tokenizer.eos_token_id]]
    before = supervised_loss(model, prompts, targets).item()
    warm_up(
        trained,
        tokenizer,
        examples,
        WarmupConfig(evaluate_every=40, learning_rate=3e-3, lr_warmup_steps=0),
        lambda current: 1.0,
    )
    after = supervised_loss(trained, prompts, targets).item()
    assert before > math.log(100) and after < before / 3
