"""Model version 0, the base policy: the embedded tiny model (built and saved on first use, its tokenizer trained on
the project's own generated text) or a local checkpoint named in the config (registered in place, not copied)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.compute as pc
from pydantic import Field

from policy.checkpoints import load_policy, save_checkpoint
from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from storage.config import Strict
from storage.lake import Lake
from storage.registry import register
from tasks.generators import generate


class BasePolicyConfig(Strict):
    """Which model is version 0."""

    checkpoint: str | None = Field(
        None,
        description="a local HF checkpoint folder to register as version 0; default: build the embedded tiny model",
    )
    served_name: str | None = Field(None, description="name an OpenAI-compatible server serves version 0 under")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="shape of the embedded tiny model")
    tokenizer_corpus: int = Field(2000, ge=10, description="generated problems the tiny tokenizer is trained on")


def ensure_base_policy(lake: Lake, config: BasePolicyConfig) -> int:
    """Register version 0 if the lake has none yet; returns 0."""
    if not lake.read("model_versions", filter=pc.field("model_version") == 0, columns=["model_version"]).is_empty():
        return 0
    with lake.run("policy-init", "policy-init", config.model_dump(mode="json")) as run:
        if config.checkpoint is not None:
            model, _ = load_policy(config.checkpoint)
            uri = config.checkpoint
        else:
            tokenizer = train_tokenizer(tokenizer_corpus(count=config.tokenizer_corpus), config.tiny.merges)
            model = build_model(config.tiny, tokenizer)
            uri = save_checkpoint(lake, 0, model, tokenizer)
        architecture = {
            "model_type": model.config.model_type,
            "vocab_size": model.config.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "hidden_size": model.config.hidden_size,
            "layers": model.config.num_hidden_layers,
        }
        register(lake, run, 0, uri=uri, kind="base", architecture=architecture, served_name=config.served_name)
    return 0


def tokenizer_corpus(seed: int = 0, count: int = 2000) -> Iterator[str]:
    """Text the tokenizer learns from: problems and worked answers of our own generators."""
    for _, _, problem in generate("mix", count=count, seed=seed):
        yield problem.prompt
        yield f"{problem.solution}\n#### {problem.answer}"
