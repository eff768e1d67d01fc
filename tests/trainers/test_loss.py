"""The GRPO / DAPO loss: hand-worked values, and parity with TRL's own GRPOTrainer._compute_loss."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from trainers.loss import LOSS_TYPES, policy_loss


@pytest.fixture
def seeded():
    torch.manual_seed(0)


def test_clipped_surrogate_by_hand():
    # one response of 2 tokens, advantage +1: ratios e^0.5 ≈ 1.65 (clipped to 1.28) and e^-0.5 ≈ 0.61 (unclipped:
    # the min takes the smaller term, and for A > 0 clipping from below never binds)
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.5]])
    out = policy_loss(logprobs, behaviour, torch.tensor([1.0]), torch.ones(1, 2), loss_type="dapo")
    assert out.loss.item() == pytest.approx(-(1.28 + math.exp(-0.5)) / 2)
    assert out.clip_fraction == pytest.approx(0.5)
    out.loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -math.exp(-0.5) / 2])  # the clipped token has no gradient


def test_negative_advantage_clips_from_below_and_weights_scale_the_response():
    logprobs = torch.tensor([[-2.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0]])  # ratio e^-1 ≈ 0.37 < 0.8: clipped for A < 0
    out = policy_loss(logprobs, behaviour, torch.tensor([-2.0]), torch.ones(1, 1), weights=torch.tensor([0.5]))
    assert out.loss.item() == pytest.approx(-(0.8 * -2.0) * 0.5)


def test_aggregations_differ_as_documented():
    per_token = torch.zeros(2, 4)  # ratio 1 everywhere: loss(i, t) = −A_i
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    advantages = torch.tensor([1.0, -1.0])
    dapo = policy_loss(per_token, per_token, advantages, mask, loss_type="dapo").loss.item()
    grpo = policy_loss(per_token, per_token, advantages, mask, loss_type="grpo").loss.item()
    dr = policy_loss(per_token, per_token, advantages, mask, loss_type="dr_grpo", max_completion_length=8).loss.item()
    assert dapo == pytest.approx((-4 + 1) / 5)  # token mean over the batch
    assert grpo == pytest.approx((-1 + 1) / 2)  # sequence means, then their mean
    assert dr == pytest.approx((-4 + 1) / (2 * 8))  # constant normaliser


def test_k3_kl_penalty():
    logprobs = torch.tensor([[-1.0]])
    ref = torch.tensor([[-1.5]])
    out = policy_loss(logprobs, logprobs, torch.tensor([0.0]), torch.ones(1, 1), ref_logprobs=ref, beta=0.1)
    kl = math.exp(-0.5) + 0.5 - 1
    assert out.kl == pytest.approx(kl) and out.loss.item() == pytest.approx(0.1 * kl)


TRL_NAMES = {"gspo": ("grpo", "sequence")}  # ours -> TRL's (loss_type, importance_sampling_level)
SAPO_TEMPERATURES = (1.0, 1.05)
CISPO_MAX = 4.0


def trl_loss(
    loss_type,
    logprobs,
    behaviour,
    advantages,
    mask,
    epsilon_high,
    beta=0.0,
    ref=None,
    max_length=None,
    importance_sampling_ratio=None,
):
    """TRL's GRPOTrainer._compute_loss on these tensors: its own code, with the forward pass replaced by ours
    (with an `importance_sampling_ratio`, as its vLLM correction applies it)."""
    from accelerate import Accelerator
    from trl import GRPOTrainer

    trl_type, level = TRL_NAMES.get(loss_type, (loss_type, "token"))
    trainer = SimpleNamespace(
        loss_type=trl_type,
        epsilon_low=0.2,
        epsilon_high=CISPO_MAX if loss_type == "cispo" else epsilon_high,  # TRL's cispo reads its ε_max there
        beta=beta,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        use_vllm=importance_sampling_ratio is not None,
        vllm_importance_sampling_correction=importance_sampling_ratio is not None,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        max_completion_length=max_length or mask.shape[1],
        current_gradient_accumulation_steps=1,
        model=SimpleNamespace(training=True),
        accelerator=Accelerator(cpu=True),
        args=SimpleNamespace(
            use_bias_correction_kl=False,
            delta=None,
            steps_per_generation=1,
            sapo_temperature_pos=SAPO_TEMPERATURES[0],
            sapo_temperature_neg=SAPO_TEMPERATURES[1],
        ),
        _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(mask.shape[0], 1, dtype=torch.long),
        "prompt_mask": torch.ones(mask.shape[0], 1),
        "completion_ids": torch.zeros_like(mask, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": behaviour,
        "num_items_in_batch": mask.sum(),
        "ref_per_token_logps": ref,
        "importance_sampling_ratio": importance_sampling_ratio,
    }
    return GRPOTrainer._compute_loss(trainer, None, inputs)


def parity_batch(batch: int = 8, length: int = 9):
    """Padding (random lengths), truncation (two responses fill the whole length) and a staleness gap (the last
    three rows' behaviour log-probs from an older policy, their ratios far outside the clip range)."""
    lengths = torch.randint(2, length + 1, (batch, 1))
    lengths[:2] = length  # truncated: the token cap reached
    mask = (torch.arange(length)[None, :] < lengths).float()
    behaviour = -torch.rand(batch, length) * 3
    start = behaviour + torch.randn(batch, length) * 0.4  # ratios on both sides of the clip range
    start[-3:] += torch.randn(3, length).abs() * 1.5 - 0.5  # stale rows
    advantages = torch.randn(batch)
    ref = behaviour + torch.randn(batch, length) * 0.2
    return mask, behaviour, start, advantages, ref


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "gspo", "cispo", "sapo"])
@pytest.mark.parametrize("epsilon_high", [0.2, 0.28], ids=["symmetric", "clip-higher"])
@pytest.mark.parametrize("beta", [0.0, 0.04], ids=["no-kl", "kl"])
def test_parity_with_trl(seeded, loss_type, epsilon_high, beta):
    mask, behaviour, start, advantages, ref = parity_batch()
    ours_input = start.clone().requires_grad_(True)
    theirs_input = start.clone().requires_grad_(True)
    ours = policy_loss(
        ours_input,
        behaviour,
        advantages,
        mask,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=epsilon_high,
        ref_logprobs=ref,
        beta=beta,
        cispo_max_ratio=CISPO_MAX,
        sapo_temperatures=SAPO_TEMPERATURES,
    ).loss
    theirs = trl_loss(loss_type, theirs_input, behaviour, advantages, mask, epsilon_high, beta, ref)
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert torch.allclose(ours_input.grad, theirs_input.grad, atol=1e-6)
    assert ours_input.grad.abs().sum() > 0  # a real gradient, not two zeros


def test_the_losses_differ_where_their_papers_say():
    """On one stale batch: gspo clips whole sequences (a row's tokens all clipped or none), cispo caps the weight
    but keeps every token's gradient, sapo clips nothing."""
    torch.manual_seed(1)
    mask, behaviour, start, advantages, _ = parity_batch()
    outputs = {}
    for loss_type in ("dapo", "gspo", "cispo", "sapo"):
        logprobs = start.clone().requires_grad_(True)
        outputs[loss_type] = policy_loss(logprobs, behaviour, advantages, mask, loss_type=loss_type)
        outputs[loss_type].loss.backward()
        outputs[loss_type] = (outputs[loss_type], logprobs.grad)
    dapo_grad, cispo_grad = outputs["dapo"][1], outputs["cispo"][1]
    assert ((dapo_grad == 0) & (mask > 0)).any()  # the clip stops some tokens' gradient
    assert ((cispo_grad != 0) | (mask == 0)).all()  # cispo's detached weight keeps every token's
    gspo_rows = outputs["gspo"][1] * mask
    assert all(bool((row[m > 0] == 0).all() or (row[m > 0] != 0).all()) for row, m in zip(gspo_rows, mask))
    assert outputs["sapo"][0].clip_fraction == 0.0 and outputs["dapo"][0].clip_fraction > 0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_zero_weight_response_is_as_if_absent(seeded, loss_type):
    logprobs = -torch.rand(3, 6)
    behaviour = logprobs + torch.randn(3, 6) * 0.1
    ref = logprobs + 0.2
    mask = torch.tensor([[1.0] * 3 + [0] * 3, [1.0] * 6, [1.0] * 2 + [0] * 4])
    advantages = torch.tensor([1.0, -0.5, 0.7])
    kwargs = dict(loss_type=loss_type, ref_logprobs=ref, beta=0.1, max_completion_length=6)
    with_masked = policy_loss(logprobs, behaviour, advantages, mask, weights=torch.tensor([1.0, 0.0, 1.0]), **kwargs)
    keep = torch.tensor([0, 2])
    without = policy_loss(
        logprobs[keep],
        behaviour[keep],
        advantages[keep],
        mask[keep],
        ref_logprobs=ref[keep],
        loss_type=loss_type,
        beta=0.1,
        max_completion_length=6,
        weights=torch.ones(2),
    )
    assert with_masked.loss.item() == pytest.approx(without.loss.item(), abs=1e-7)
