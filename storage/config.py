"""The base of every typed config, and reading configs from YAML: a file may name a `base:` file it varies, and a
run config's stage sections load into their stage's config. Errors name the file and the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from storage.config_errors import describe


class Strict(BaseModel):
    """A config that refuses unknown fields: a misspelt setting is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


def read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A YAML mapping; a top-level `base: other.yaml` (relative to this file) is read first and this
    file's settings are merged over it, section by section, so a variant states only what differs."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: cannot read config: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings at the top level")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ValueError(f"{path}: `base` names another YAML file, e.g. `base: demo.yaml`")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise ValueError(f"{path}: `base: {base}` makes a cycle")
    return merged_config(read_yaml(base_path, seen + (path.resolve(),)), data)


# Settings whose value is itself a mapping of data (not of settings): a variant replaces them whole.
VALUE_MAPPINGS = {"level_weights", "domain_weights", "level_map", "params", "options", "columns"}


def merged_config(base: dict, override: dict) -> dict:
    """`override`'s settings over `base`'s, section by section (mappings of data are replaced whole)."""
    merged = dict(base)
    for key, value in override.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict) and key not in VALUE_MAPPINGS
        merged[key] = merged_config(base[key], value) if nested else value
    return merged


def load_yaml_config(
    path: str | Path, model: type[BaseModel], section: str | tuple[str, ...] | None = None
) -> BaseModel:
    """Load and validate a YAML config (its `section` if it has one, or the named sections of a run
    config); errors name the file and the field."""
    return validated_config(read_yaml(Path(path)), path, model, section)


def validated_config(
    whole: dict, path: str | Path, model: type[BaseModel], section: str | tuple[str, ...] | None = None
) -> BaseModel:
    """`load_yaml_config` of a file already read (`read_yaml(path)` is `whole`): a caller that takes several
    configs out of one file reads it once."""
    path = Path(path)
    data = whole
    if isinstance(section, tuple):  # several stage sections of a run config
        data = {name: whole[name] for name in section if name in whole}
    elif section is not None and section in whole:  # a run config's stage section, or a stage config itself
        data = whole[section]
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ValueError(describe(error, path, model, section, whole)) from None
