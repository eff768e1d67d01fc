"""Turning command-line inputs into typed configs."""

from __future__ import annotations

from pathlib import Path

from storage.config import load_yaml_config
from tasks.curation.config import CurationConfig, parse_source_spec


def curation_config_from(
    config_path: Path | None, sources: list[str], eval_sources: list[str], bank_version: int | None
) -> CurationConfig:
    """A config file (its `bank:` section if it has one), plus any `--source`s, plus overrides."""
    if config_path is None and not sources and not eval_sources:
        raise ValueError("give --config FILE or at least one --source KIND:PATH_OR_NAME[:COUNT]")
    extra = [parse_source_spec(s) for s in sources]
    extra += [parse_source_spec(s).model_copy(update={"split": "eval"}) for s in eval_sources]
    if config_path is not None:
        config = load_yaml_config(config_path, CurationConfig, section="bank")
        config = config.model_copy(update={"sources": config.sources + extra})
    else:
        config = CurationConfig(sources=extra)
    if bank_version is not None:
        config = config.model_copy(update={"bank_version": bank_version})
    return config


def parse_weights(text: str | None) -> dict[str, float] | None:
    """`math=0.7,code=0.3` → {"math": 0.7, "code": 0.3}."""
    if not text:
        return None
    weights = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"weight {part!r}: expected NAME=NUMBER") from None
    return weights
