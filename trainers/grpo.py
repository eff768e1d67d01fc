"""The GRPO / DAPO training step: one `batches` table in, model version N+1 out.

Reads top to bottom like a recipe: load version N and its optimizer state, recompute the
log-probs of the batch's responses, take the clipped policy-gradient loss against the stored
behaviour log-probs (token-level DAPO mean by default, Clip-Higher 0.2 / 0.28), accumulate over
micro-batches, clip the gradient, step AdamW with a linear warm-up, and return the metrics.
Devices and mixed precision go through accelerate. What is kept from the papers: DAPO's
token-level loss and Clip-Higher; GRPO's and Dr.GRPO's aggregations as options; an optional k3 KL
penalty to a reference version (β = 0 by default, as DAPO drops it). What is dropped: PPO's value
model (the advantages come from the group), and several passes over one batch (one by default).
"""

from __future__ import annotations

import random
from typing import Literal

import polars as pl
from pydantic import Field, model_validator

from policy.logprobs import response_logprobs, right_padded
from storage.config import Strict
from trainers.correction import RolloutCorrection, correction_weights, token_log_ratios
from trainers.distributed import SingleDevice
from trainers.loss import LOSSES, policy_loss
from trainers.mismatch import mismatch_metrics, mismatch_rows


class LoraSettings(Strict):
    """Train a LoRA adapter instead of every weight; each version is then an adapter vLLM can hot-load."""

    r: int = Field(8, ge=1, description="adapter rank")
    alpha: int = Field(16, ge=1, description="scaling numerator (the update is scaled by alpha / r)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="modules that get an adapter"
    )


class TrainConfig(Strict):
    """One training step per iteration's batch."""

    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo", "gspo", "cispo", "sapo"] = Field(
        "dapo",
        description="the objective (trainers/loss.py): dapo = clipped, token mean over the batch; grpo = per-sequence "
        "mean; dr_grpo = constant normaliser; bnpo = token mean per micro-batch; gspo = the sequence's ratio, "
        "clipped; cispo = the capped weight detached; sapo = a soft gate instead of the clip",
    )
    epsilon_low: float = Field(0.2, ge=0, description="lower clip of the ratio: 1 - epsilon_low")
    epsilon_high: float = Field(
        0.28,
        ge=0,
        description="upper clip (Clip-Higher: above epsilon_low lets rare tokens grow, against entropy collapse)",
    )
    cispo_max_ratio: float = Field(5.0, gt=0, description="cispo: cap of the detached importance weight (ε_max)")
    sapo_temperature_positive: float = Field(1.0, gt=0, description="sapo: gate temperature of positive advantages")
    sapo_temperature_negative: float = Field(
        1.05, gt=0, description="sapo: gate temperature of negative advantages (above the positive one: faster decay)"
    )
    beta: float = Field(0.0, ge=0, description="weight of the k3 KL penalty to the reference version; 0 disables it")
    reference_version: int = Field(0, ge=0, description="model version the KL penalty pulls toward")
    learning_rate: float = Field(1e-4, gt=0, description="AdamW learning rate after warm-up")
    warmup_steps: int = Field(
        0,
        ge=0,
        description="optimizer steps of linear learning-rate warm-up, counted over "
        "the whole run (the step count travels with the checkpoint)",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per batch (the batch is split into this many)")
    micro_batch_size: int = Field(32, ge=1, description="sequences per forward pass (gradient accumulation)")
    max_completion_length: int | None = Field(
        None,
        ge=1,
        description="dr_grpo's constant; default the rollouts' max_new_tokens (else the batch's longest response)",
    )
    mixed_precision: Literal["no", "fp16", "bf16"] = Field("no", description="accelerate mixed precision (GPU)")
    device: str = Field("cpu", description="cpu, or cuda on a GPU machine")
    lora: LoraSettings | None = Field(None, description="train a LoRA adapter (peft) instead of the full model")
    seed: int = Field(0, description="seed of the mini-batch shuffle")
    off_policy_loss: Literal["behaviour", "decoupled"] = Field(
        "behaviour",
        description="behaviour: the ratio "
        "to the stored behaviour log-probs is clipped (PPO "
        "with π_old = π_behaviour); decoupled (AReaL): the "
        "ratio to the proximal policy, the one at the "
        "batch's start, is clipped and each token weighted "
        "by its truncated π_prox / π_behaviour (π_prox from "
        "a no-grad pass before the batch's first update "
        "when it takes several optimizer steps)",
    )
    importance_cap: float = Field(2.0, gt=0, description="decoupled: truncation of the per-token weight")
    rollout_correction: RolloutCorrection = Field(
        default_factory=RolloutCorrection,
        description="the weight of each token for the sampler-trainer gap (trainers/correction.py); "
        "off_policy_loss decoupled is token_tis with high = importance_cap",
    )
    record_mismatch: bool = Field(
        True,
        description="keep every trained rollout's per-token gap between the sampler's and the trainer's "
        "log-probs (the mismatch table, the mismatch_* metrics); off: neither",
    )
    strategy: Literal["single", "ddp", "fsdp"] = Field(
        "single",
        description="single: this process trains; ddp: "
        "`processes` persistent ranks on torch.distributed, a full copy "
        "each (DistributedDataParallel); fsdp: the same ranks with "
        "parameters, gradients and optimizer state sharded (FSDP2)",
    )
    processes: int = Field(
        1,
        ge=1,
        description="ranks of ddp / fsdp (gloo on CPU, NCCL on GPUs), started once per "
        "run and kept between steps; each takes a share of every mini-batch. More than 1 with "
        "strategy single means ddp",
    )
    devices: list[str] = Field(
        default_factory=list,
        description="one device per rank (e.g. [cuda:4, cuda:5]); "
        "empty: `device` for every rank on a CPU, cuda:0, cuda:1, ... on GPUs",
    )
    share_devices: bool = Field(
        False,
        description="allow the trainer's GPUs to be ones the sampling role holds "
        "(rollout.devices, rollout.openai.server_devices); else the run refuses to start",
    )

    @model_validator(mode="after")
    def _one_weight_per_token(self):
        """`off_policy_loss: decoupled` is refused with a `rollout_correction.mode`: decoupled is the token_tis
        correction already (high = importance_cap), and each token gets one weight."""
        if self.off_policy_loss == "decoupled" and self.rollout_correction.mode != "none":
            raise ValueError(
                "train.off_policy_loss decoupled is the token_tis correction already (high = importance_cap): "
                "set train.rollout_correction.mode or off_policy_loss decoupled, not both"
            )
        return self

    def correction(self) -> RolloutCorrection:
        """The correction a step applies: the configured one, or decoupled's token_tis at `importance_cap`."""
        if self.off_policy_loss == "decoupled":
            return RolloutCorrection(mode="token_tis", high=self.importance_cap)
        return self.rollout_correction


def rank_devices(config: TrainConfig) -> list[str]:
    """One device per rank: `train.devices`, else `device` for every rank on a CPU, cuda:0..N-1 on GPUs."""
    if config.devices:
        if len(config.devices) != config.processes:
            raise ValueError(f"train.devices lists {len(config.devices)} device(s) for {config.processes} process(es)")
        return list(config.devices)
    if config.device.startswith("cuda"):
        return [f"cuda:{rank}" for rank in range(config.processes)]
    return [config.device] * config.processes


def strategy_of(config: TrainConfig) -> str:
    """The strategy that runs: several processes with `single` mean ddp."""
    return "ddp" if config.strategy == "single" and config.processes > 1 else config.strategy


def train_on_batch(
    model, rows: pl.DataFrame, config: TrainConfig, optimizer_state: dict | None = None, reference=None
) -> tuple[dict, dict]:
    """One batch's optimizer steps on `model` in place, in this process; returns (metrics, optimizer state).

    `rows` holds one row per rollout: prompt_token_ids, response_token_ids, behaviour_logprobs,
    advantage, weight, temperature. Several ranks: `trainers/workers.py` calls `train_steps` itself.
    """

    placement = SingleDevice(config.device, config.mixed_precision)
    optimizer, step = build_optimizer(model, config, optimizer_state)
    model, optimizer = placement.prepare(model, optimizer)
    metrics, step = train_steps(model, optimizer, step, rows, config, placement, reference)
    return metrics, {"optimizer": optimizer.state_dict(), "step": step}


def build_optimizer(model, config: TrainConfig, optimizer_state: dict | None = None):
    """(AdamW over the trainable parameters, the optimizer step count), continuing the parent version's state."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]  # all of them, or a LoRA adapter's
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    if optimizer_state:
        optimizer.load_state_dict(optimizer_state["optimizer"])
        for group in optimizer.param_groups:  # the config decides, not the first run's saved settings
            group["weight_decay"] = config.weight_decay
    return optimizer, (optimizer_state["step"] if optimizer_state else 0)


def train_steps(
    model, optimizer, step: int, rows: pl.DataFrame, config: TrainConfig, placement, reference=None
) -> tuple[dict, int]:
    """The batch's optimizer steps (`config.mini_batches`) from optimizer step `step`: (metrics, step after).
    With several ranks (`placement.world`), each takes every world-th row of each mini-batch and runs the same
    number of micro-batches (an idle one, weight 0, where its share is short), so the collectives line up."""
    import torch

    rank, world = placement.rank, placement.world
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.train()
    rows = rows.filter(pl.col("weight") > 0)  # masked responses (weight 0) are not in the batch at all
    order = list(range(rows.height))
    random.Random(config.seed + step).shuffle(order)
    shares_prompts = placement.shares_prompts
    # each mini-batch's micro-batches cut from its rows in length order: a micro-batch is padded to its longest
    # sequence, and the gradient, a sum over the mini-batch, does not depend on the order (~12 % of the step)
    lengths = (rows["prompt_token_ids"].list.len() + rows["response_token_ids"].list.len()).to_list()
    prompts = [tuple(ids) for ids in rows["prompt_token_ids"].to_list()] if shares_prompts else None
    mini_batches = [
        micro_batch_order(order[i :: config.mini_batches], lengths, prompts)
        for i in range(config.mini_batches)
        if order[i :: config.mini_batches]
    ]
    longest = config.max_completion_length or int(rows["response_token_ids"].list.len().max())
    totals = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0, "tokens": 0}
    totals["masked"], gaps = 0.0, []  # tokens the correction weighed 0; each micro-batch's sampler-trainer gap
    # ---- π_old of a correction (the decoupled objective's proximal policy): the batch's start, kept throughout ----
    correction = config.correction()
    proximal = proximal_logprobs(model, rows, mini_batches, config, placement) if correction.mode != "none" else {}
    has_batch_start_logprobs = bool(proximal)  # every micro-batch's π_old, taken before the first update

    for number, indices in enumerate(mini_batches):
        # ---- one optimizer step: the mini-batch in micro-batches, gradients accumulated ----
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * min(1.0, (step + 1) / max(config.warmup_steps, 1))
        mini = rows[indices]
        tokens = policy_tokens(mini)  # normalisers count the whole mini-batch
        micro_batches = rank_micro_batches(mini, rank, world, config.micro_batch_size)
        optimizer.zero_grad()
        for index, (micro, idle) in enumerate(micro_batches):
            with placement.accumulating(model, last=index == len(micro_batches) - 1):  # ranks sync on the last
                out, mask, entropy, loss, observed = micro_batch_loss(
                    model,
                    micro,
                    mini,
                    tokens,
                    longest,
                    config,
                    placement,
                    reference,
                    idle,
                    proximal.get((number, index)),
                )
            if idle:
                continue
            micro_tokens = float(mask.sum())
            if observed is not None:
                trainer, behaviour, weights = observed
                if config.record_mismatch:  # the sampler-trainer gap of each row, for the mismatch table
                    ids = micro["rollout_id"].to_list() if "rollout_id" in micro.columns else [None] * micro.height
                    after = 0 if number == 0 or has_batch_start_logprobs else number  # updates the trainer's were after
                    gaps.append((ids, token_log_ratios(trainer, behaviour, mask), mask.detach(), after))
                if weights is not None:
                    totals["masked"] += float(((weights == 0) & (mask > 0)).sum())
            totals["loss"] += float(loss.detach())
            totals["clip_fraction"] += out.clip_fraction * micro_tokens
            totals["kl"] += out.kl * micro_tokens
            totals["entropy"] += float(entropy.sum())
        grad_norm = placement.clip(trainable, config.max_grad_norm)
        optimizer.step()
        step += 1
        totals["grad_norm"] += grad_norm
        totals["tokens"] += tokens

    model.eval()
    mismatch = [row for ids, delta, mask, after in gaps for row in mismatch_rows(ids, delta, mask, correction, after)]
    shared = ["loss", "clip_fraction", "kl", "entropy", "masked"]  # each rank's share of the sums
    totals.update(zip(shared, placement.sum([totals[name] for name in shared])))
    steps, tokens = len(mini_batches), max(totals["tokens"], 1)
    metrics = {
        "loss": totals["loss"] / steps,
        "clip_fraction": totals["clip_fraction"] / tokens,
        "kl": totals["kl"] / tokens,
        "entropy": totals["entropy"] / tokens,
        "grad_norm": totals["grad_norm"] / steps,
        "tokens": totals["tokens"],
        "optimizer_steps": steps,
        "sequences": rows.height,
        "learning_rate": optimizer.param_groups[0]["lr"],
        "global_step": step,
        "torch_threads": torch.get_num_threads(),  # bit-reproducible only at the same count
        "processes": world,
        "correction_masked_share": totals["masked"] / tokens,
        **mismatch_metrics(mismatch),
        "mismatch_rows": mismatch,  # popped by the stage, for the mismatch table
    }
    return metrics, step


def proximal_logprobs(model, rows: pl.DataFrame, mini_batches: list[list[int]], config: TrainConfig, placement) -> dict:
    """The proximal policy's log-probs (AReaL's π_prox, the policy before the batch's first update) of every
    micro-batch this rank forwards after that update, by (mini-batch, micro-batch): a no-grad pass now, before
    any step. The first mini-batch's are its own forward's, detached (the model has not moved yet). Every rank
    runs the same number of forwards (idle micro-batches included): FSDP's are collectives."""
    import torch

    kept = {}
    with torch.no_grad():
        for number, indices in enumerate(mini_batches[1:], start=1):
            for index, (micro, _) in enumerate(
                rank_micro_batches(rows[indices], placement.rank, placement.world, config.micro_batch_size)
            ):
                with placement.autocast():
                    logprobs, _, _ = response_logprobs(
                        model,
                        micro["prompt_token_ids"].to_list(),
                        micro["response_token_ids"].to_list(),
                        float(micro["temperature"][0]),
                        share_prompts=placement.shares_prompts,
                    )  # [B, T]
                kept[(number, index)] = logprobs.float()
    return kept


def micro_batch_loss(
    model,
    micro: pl.DataFrame,
    mini: pl.DataFrame,
    tokens: int,
    longest: int,
    config: TrainConfig,
    placement,
    reference=None,
    idle: bool = False,
    proximal=None,
):
    """Forward, the policy loss and its backward for one micro-batch: (loss output, mask, entropy, loss, observed:
    the trainer's log-probs of the rows, the sampler's and the correction's weights, or None when idle).
    `proximal`: the decoupled objective's π_prox log-probs of these rows ([B, T]; None: this forward's own,
    the model not having moved since the batch began)."""
    import torch

    prompts, responses = micro["prompt_token_ids"].to_list(), micro["response_token_ids"].to_list()
    shares_prompts = placement.shares_prompts
    with placement.autocast():
        logprobs, mask, entropy = response_logprobs(
            model, prompts, responses, float(micro["temperature"][0]), with_entropy=True, share_prompts=shares_prompts
        )  # [B, T] each
    device = logprobs.device
    if "loss_mask" in micro.columns and micro["loss_mask"].null_count() < micro.height:
        mask = mask * loss_masks(micro, mask.shape[1], device)  # episodes: the tool's tokens are out
        entropy = entropy * mask
    behaviour = sampled = right_padded(micro["behaviour_logprobs"].to_list(), logprobs.shape[1], device)[0]  # [B, T]
    token_weights = None
    correction = config.correction()
    if correction.mode != "none":  # the policy before the batch's first update is π_old, the clip's anchor
        proximal = logprobs.detach() if proximal is None else proximal * mask
        token_weights = correction_weights(proximal, behaviour, mask, correction)
        behaviour = proximal
    ref_logprobs = None
    if config.beta and reference is not None:
        with torch.no_grad():
            ref_logprobs, _, _ = response_logprobs(
                reference, prompts, responses, float(micro["temperature"][0]), share_prompts=shares_prompts
            )
    share = micro.height / mini.height  # the losses not normalised by the whole batch's tokens
    out = policy_loss(
        logprobs,
        behaviour,
        torch.tensor(micro["advantage"].to_list(), device=device),
        mask,
        loss_type=config.loss_type,
        epsilon_low=config.epsilon_low,
        epsilon_high=config.epsilon_high,
        ref_logprobs=ref_logprobs,
        beta=config.beta,
        weights=torch.tensor(micro["weight"].to_list(), device=device),
        max_completion_length=longest,
        token_normaliser=float(max(tokens, 1)),
        token_weights=token_weights,
        cispo_max_ratio=config.cispo_max_ratio,
        sapo_temperatures=(config.sapo_temperature_positive, config.sapo_temperature_negative),
    )
    loss = (out.loss if LOSSES[config.loss_type].whole_batch else out.loss * share) * (0.0 if idle else 1.0)
    placement.backward(loss * placement.loss_scale)  # DDP and FSDP average over ranks: scaled to a sum
    observed = None if idle else (proximal if proximal is not None else logprobs.detach(), sampled, token_weights)
    return out, mask, entropy, loss, observed


def micro_batch_order(indices: list[int], lengths: list[int], prompts: list[tuple[int, ...]] | None) -> list[int]:
    """A mini-batch's rows (`indices` into the step's `lengths`) in the order its micro-batches are cut: by
    length, so each is padded little; where a micro-batch forwards a repeated prompt once (`prompts` given:
    each row's), a group's rows stay together, groups ordered by their longest row."""
    if prompts is None:
        return sorted(indices, key=lambda index: lengths[index])
    longest: dict[tuple[int, ...], int] = {}
    for index in indices:
        longest[prompts[index]] = max(longest.get(prompts[index], 0), lengths[index])
    return sorted(indices, key=lambda index: (longest[prompts[index]], prompts[index], lengths[index]))


def rank_micro_batches(mini: pl.DataFrame, rank: int, world: int, size: int) -> list[tuple[pl.DataFrame, bool]]:
    """This rank's micro-batches of a mini-batch: (rows, idle). Every rank gets the same count, the longest
    share's; a shorter share is topped up with idle ones (one row, weight 0: it runs, and adds nothing)."""
    mine = mini[rank::world]  # lengths interleaved over ranks
    per_rank = -(-mini.height // world)  # ceilings of integer divisions
    count = -(-per_rank // size)
    batches = [(mine[start : start + size], False) for start in range(0, mine.height, size)]
    idle = mini[:1].with_columns(pl.lit(0.0).alias("weight"), pl.lit(0.0).alias("advantage"))
    return batches + [(idle, True)] * (count - len(batches))


def policy_tokens(rows: pl.DataFrame) -> int:
    """Response tokens the policy loss counts: all of them, but an episode's own only (its loss mask's ones)."""
    lengths = rows["response_token_ids"].list.len()
    if "loss_mask" not in rows.columns:
        return int(lengths.sum())
    return int(rows["loss_mask"].list.sum().fill_null(lengths.cast(pl.Int64)).sum())


def loss_masks(rows: pl.DataFrame, width: int, device):
    """[B, T] of each row's loss mask (ones where a row has none), right-padded with zeros."""
    masks = [
        mask if mask is not None else [1] * len(ids)
        for mask, ids in zip(rows["loss_mask"].to_list(), rows["response_token_ids"].to_list())
    ]
    return right_padded(masks, width, device)[0]
