"""The model a training step trains: the parent version's weights, whole or with a LoRA adapter (continued when
the parent is an adapter, fresh otherwise). One process or each rank of several (`trainers/workers.py`) start here."""

from __future__ import annotations

from policy.checkpoints import adapter_base, load_policy, peft_warnings_quiet
from trainers.grpo import TrainConfig


def trainable_policy(parent_uri: str, config: TrainConfig):
    """(model, tokenizer, base URI if the model is a LoRA adapter): the parent's adapter continues
    when the parent is one; a full parent gets a fresh adapter, or is trained whole without `lora`."""
    base = adapter_base(parent_uri)
    if config.lora is None:
        model, tokenizer = load_policy(parent_uri, config.device)  # an adapter parent arrives merged
        return model, tokenizer, None
    if base is not None:
        model, tokenizer = load_policy(parent_uri, config.device, trainable_adapter=True)
        return model, tokenizer, base
    from peft import LoraConfig, get_peft_model

    model, tokenizer = load_policy(parent_uri, config.device)
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        task_type="CAUSAL_LM",
    )
    import torch

    with peft_warnings_quiet(), torch.random.fork_rng():  # a fresh adapter's initialisation is seeded: every
        torch.manual_seed(config.seed)  # rank (and a rerun) starts from the same one
        return get_peft_model(model, lora), tokenizer, parent_uri
