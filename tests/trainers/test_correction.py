"""The rollout correction: TRL's own importance-sampling code on the same tensors for the modes TRL has, the
loss it composes with, and verl's geometric rejection and IcePop's mask by hand."""

import inspect
import math
import textwrap
from types import SimpleNamespace

import pytest
import torch
from test_loss import trl_loss

from trainers.correction import RolloutCorrection, correction_weights
from trainers.grpo import TrainConfig
from trainers.loss import policy_loss

TRL_MODES = {
    "token_tis": "token_truncate",
    "sequence_tis": "sequence_truncate",
    "token_mask": "token_mask",
    "sequence_mask": "sequence_mask",
}


def trl_ratio(old, sampling, mask, mode: str, low, high) -> torch.Tensor:
    """The importance-sampling ratio exactly as TRL 1.16's `_generate_and_score_completions` computes it: its
    own block of code, cut from its source and run on these tensors."""
    from trl import GRPOTrainer

    source = textwrap.dedent(inspect.getsource(GRPOTrainer._generate_and_score_completions))
    start = source.index("if self.use_vllm and self.vllm_importance_sampling_correction:\n")
    end = source.index("# Compute the per-token log probabilities for the reference model")
    block = textwrap.dedent(source[start:end])
    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=low,
        vllm_importance_sampling_clip_max=high,
    )
    scope = {
        "self": trainer,
        "torch": torch,
        "math": math,
        "completion_mask": mask,
        "tool_mask": None,
        "old_per_token_logps": old,
        "sampling_per_token_logps": sampling,
    }
    exec(compile(block, "trl_grpo_trainer_block", "exec"), scope)
    return scope["vllm_importance_sampling_ratio"].expand_as(old)


def gap_batch(batch: int = 8, length: int = 7):
    """A trainer and a sampler that disagree a little on most tokens and a lot on a few (bf16 against fp32)."""
    torch.manual_seed(0)
    mask = (torch.arange(length)[None, :] < torch.randint(2, length + 1, (batch, 1))).float()
    sampling = -torch.rand(batch, length) * 3
    old = sampling + torch.randn(batch, length) * 0.05
    old[1, 0] += 2.0  # one token the engine found far less likely
    old[5] += 0.3  # a whole row off
    return mask, sampling, old


@pytest.mark.parametrize("mode", sorted(TRL_MODES))
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (0.9, 1.1)], ids=["default", "wide", "tight"])
def test_the_weights_are_trls(mode, bounds):
    mask, sampling, old = gap_batch()
    low, high = bounds
    ours = correction_weights(old, sampling, mask, RolloutCorrection(mode=mode, low=low, high=high))
    theirs = trl_ratio(old, sampling, mask, TRL_MODES[mode], low, high)
    assert torch.allclose(ours, theirs * mask, atol=1e-6)
    if mode.endswith("mask") and bounds != (None, 3.0):
        assert ((ours == 0) & (mask > 0)).any()  # the bounds bite


@pytest.mark.parametrize("mode", sorted(TRL_MODES))
def test_the_corrected_loss_is_trls(mode):
    """TRL multiplies each token's loss by the ratio after the surrogate and before the KL term, the surrogate's
    ratio taken to π_old: the step's token weights do the same."""
    mask, sampling, old = gap_batch()
    advantages = torch.randn(mask.shape[0])
    start = old + torch.randn_like(old) * 0.3
    ours_input, theirs_input = start.clone().requires_grad_(True), start.clone().requires_grad_(True)
    weights = correction_weights(old, sampling, mask, RolloutCorrection(mode=mode))
    ours = policy_loss(ours_input, old, advantages, mask, token_weights=weights).loss
    ratio = trl_ratio(old, sampling, mask, TRL_MODES[mode], None, 3.0)
    theirs = trl_loss("dapo", theirs_input, old, advantages, mask, 0.28, importance_sampling_ratio=ratio)
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert torch.allclose(ours_input.grad, theirs_input.grad, atol=1e-6)


def test_geometric_rejection_keeps_rows_whose_geometric_mean_ratio_is_near_one():
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    sampling = torch.zeros(2, 4)
    old = torch.tensor([[0.0003, -0.0003, 0.0003, 9.0], [0.01, 0.0, 0.0, 0.0]])  # row 0's padding ignored
    weights = correction_weights(old, sampling, mask, RolloutCorrection(mode="geometric"))  # [1/1.001, 1.001]
    assert weights.tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # exp(0.0025) > 1.001: rejected
    assert RolloutCorrection(mode="geometric", high=1.002).bounds() == (pytest.approx(1 / 1.002), 1.002)


def test_icepop_keeps_the_ratio_inside_its_band_and_zeroes_the_rest():
    mask = torch.ones(1, 3)
    old = torch.log(torch.tensor([[1.2, 0.4, 6.0]]))
    weights = correction_weights(old, torch.zeros(1, 3), mask, RolloutCorrection(mode="icepop"))
    assert weights.tolist() == [[pytest.approx(1.2), 0.0, 0.0]]


def test_decoupled_is_token_tis_at_the_importance_cap_and_the_two_are_not_combined():
    assert TrainConfig(off_policy_loss="decoupled", importance_cap=2.5).correction() == RolloutCorrection(
        mode="token_tis", high=2.5
    )
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(off_policy_loss="decoupled", rollout_correction={"mode": "icepop"})
    with pytest.raises(ValueError, match="above high"):
        RolloutCorrection(mode="token_mask", low=4.0)
