"""TRL's side of the peer benchmark (`bench/peer.py`): the run config mirrored as `GRPOConfig` settings (or
refused, naming what TRL cannot do the same way), checked against the arguments TRL ends up with, and the batch
layouts the sweep tries."""

from __future__ import annotations

# TRL's batch layouts swept, each one optimizer step per prompts × G rollouts:
# (per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation) as fractions of that batch.
TRL_LAYOUTS = ((1, 1, 1), (2, 2, 2), (4, 4, 4), (8, 8, 8), (2, 2, 4))


class CannotMirror(ValueError):
    """The config sets something TRL's GRPOTrainer cannot be given the same way."""


SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none", "batch_std": "batch"}


def mirror(config) -> dict:
    """Both sides' settings from one run config: {"rows": [(setting, ours, TRL)], "trl": GRPOConfig keywords
    without the batch layout, "rollouts_per_step": what an optimizer step trains on, on both sides}. Raises
    CannotMirror naming every field TRL cannot be given the same way."""
    rollout, train, sampler = config.rollout, config.train, config.rollout.sampler
    refused = [
        why
        for why in (
            config.advantages.estimator not in SCALE_REWARDS
            and f"advantages.estimator {config.advantages.estimator} "
            "(TRL's GRPOTrainer scales by group, batch or not at all: grpo, batch_std, dr_grpo)",
            train.beta > 0 and "train.beta > 0 (TRL's KL reference is the model it starts from, ours a version)",
            train.mini_batches > 1 and "train.mini_batches > 1",
            train.lora is not None and "train.lora",
            train.mixed_precision != "no" and f"train.mixed_precision {train.mixed_precision}",
            train.device != "cpu" and f"train.device {train.device} (the benchmark runs both sides on the CPU)",
            train.processes > 1 and "train.processes > 1",
            rollout.backend != "hf" and f"rollout.backend {rollout.backend}",
            rollout.tools.enabled and "rollout.tools",
            config.selfplay.enabled and "selfplay",
            config.selfverify.enabled and "selfverify",
            set(config.reward.components) != {"verifier"}
            and f"reward.components {sorted(config.reward.components)} (TRL is given the verifier's reward alone)",
            config.advantages.max_length is not None and "advantages.max_length (overlong shaping)",
            sampler.stop and "rollout.sampler.stop",
        )
        if why
    ]
    if refused:
        raise CannotMirror("TRL's GRPOTrainer cannot mirror " + "; ".join(refused))
    prompts, group = config.dynamic_sampling.groups_per_batch, rollout.group_size
    trl = {
        "num_generations": group,
        "num_iterations": 1,
        "max_completion_length": sampler.max_new_tokens,
        "temperature": sampler.temperature,
        "top_p": sampler.top_p,
        "top_k": sampler.top_k,
        "scale_rewards": SCALE_REWARDS[config.advantages.estimator],
        "epsilon": train.epsilon_low,
        **trl_objective(train),
        "beta": 0.0,
        "mask_truncated_completions": config.advantages.mask_truncated,
        "learning_rate": train.learning_rate,
        "warmup_steps": train.warmup_steps,
        "lr_scheduler_type": "constant_with_warmup" if train.warmup_steps else "constant",
        "weight_decay": train.weight_decay,
        "max_grad_norm": train.max_grad_norm,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
    }
    rows = [
        (
            "rollouts per optimizer step",
            f"{prompts} prompts × {group} (kept groups)",
            f"{prompts * group} (per-device batch × accumulation)",
        ),
        ("responses per prompt (G)", group, trl["num_generations"]),
        ("updates per batch", train.mini_batches, trl["num_iterations"]),
        ("max new tokens", sampler.max_new_tokens, trl["max_completion_length"]),
        ("temperature", sampler.temperature, trl["temperature"]),
        ("top-p", sampler.top_p, trl["top_p"]),
        ("top-k", sampler.top_k, trl["top_k"]),
        ("loss aggregation", train.loss_type, trl["loss_type"]),
        ("advantage scaling", config.advantages.estimator, trl["scale_rewards"]),
        ("clip ε low / high", (train.epsilon_low, train.epsilon_high), (trl["epsilon"], trl["epsilon_high"])),
        ("KL β", train.beta, trl["beta"]),
        ("truncated completions masked", config.advantages.mask_truncated, trl["mask_truncated_completions"]),
        ("learning rate", train.learning_rate, trl["learning_rate"]),
        ("warm-up steps", train.warmup_steps, trl["warmup_steps"]),
        ("weight decay", train.weight_decay, trl["weight_decay"]),
        ("gradient clip", train.max_grad_norm, trl["max_grad_norm"]),
        ("precision", "fp32", "fp32" if not (trl["bf16"] or trl["fp16"]) else "mixed"),
    ]
    return {"rows": rows, "trl": trl, "rollouts_per_step": prompts * group}


def check_trl_arguments(args, mirrored: dict) -> None:
    """What TRL will run with, read back from its GRPOConfig, equals the mirrored settings (TRL may adjust a
    value it is given); else CannotMirror naming each difference."""
    differ = [
        f"{key}: ours {value!r}, TRL runs {getattr(args, key)!r}"
        for key, value in mirrored["trl"].items()
        if key != "use_cpu"
        and getattr(args, key) != value
        and not (key == "lr_scheduler_type" and str(getattr(args, key)).endswith(value))
    ]
    if differ:
        raise CannotMirror("TRL's GRPOConfig does not run the mirrored settings: " + "; ".join(differ))


def trl_arguments(mirrored: dict, layout: dict, seed: int, steps: int, output_dir: str):
    """TRL's GRPOConfig for the mirrored settings and one batch layout, checked to run what it was given."""
    import warnings

    from trl import GRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = GRPOConfig(
            output_dir=output_dir,
            seed=seed,
            max_steps=steps,
            **mirrored["trl"],
            **layout,
            report_to=[],
            logging_steps=10**9,
            save_strategy="no",
            gradient_checkpointing=False,
            disable_tqdm=True,
        )
    check_trl_arguments(args, mirrored)
    return args


def trl_layout(config, fractions: tuple[int, int, int]) -> dict:
    """GRPOConfig's batch keywords for one layout: one optimizer step per prompts × G rollouts."""
    rows = config.dynamic_sampling.groups_per_batch * config.rollout.group_size
    micro, accumulation, per_generation = fractions
    return {
        "per_device_train_batch_size": rows // micro,
        "gradient_accumulation_steps": accumulation,
        "steps_per_generation": per_generation,
    }


def trl_objective(train) -> dict:
    """Our `train.loss_type` in GRPOConfig's terms: gspo is TRL's grpo with sequence-level ratios, and TRL's cispo
    reads its cap ε_max from `epsilon_high`."""
    loss_type, level = ("grpo", "sequence") if train.loss_type == "gspo" else (train.loss_type, "token")
    return {
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "epsilon_high": train.cispo_max_ratio if train.loss_type == "cispo" else train.epsilon_high,
        "sapo_temperature_pos": train.sapo_temperature_positive,
        "sapo_temperature_neg": train.sapo_temperature_negative,
    }
