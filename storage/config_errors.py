"""What a config error says: which kind of config the file was read as and why, the YAML line of each field at
fault, and for a field that does not exist the closest one that does. Pure: a file's text in, lines of text out."""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError


def describe(
    error: ValidationError, path: Path, model: type[BaseModel], section: str | tuple[str, ...] | None, data: dict
) -> str:
    """The lines of a validation error: first what the file was read as, then one line per error,
    `FILE:LINE: dotted.field: message (did you mean name?)`, FILE being the `base:` file where one sets it."""
    lines = [f"{path}: read as {kind_of(model)} ({why(section, data)})"]
    prefix = (section,) if isinstance(section, str) and section in data else ()
    roots: dict[Path, yaml.Node | None] = {}  # each file's YAML composed once for all the errors' lines
    for item in error.errors():
        loc = tuple(item["loc"])
        message = item["msg"]
        if item["type"] == "extra_forbidden" and loc:
            closest = closest_field(str(loc[-1]), model, loc[:-1])
            if closest:
                message += f" (did you mean {closest}?)"
        where = key_line(path, prefix + loc, roots=roots) if loc else named_line(path, message, roots)
        place = f"{where[0]}:{where[1]}" if where else str(path)  # a `base:` file's line where it sets it
        lines.append(f"{place}: {'.'.join(map(str, loc)) or '(a rule across fields)'}: {message}")
    return "\n".join(lines)


def kind_of(model: type[BaseModel]) -> str:
    """`CurationConfig` → "a curation config": the words of its class name."""
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", model.__name__.removesuffix("Config")).lower()
    return f"{'an' if words[:1] in 'aeiou' else 'a'} {words} config"


def why(section: str | tuple[str, ...] | None, data: dict) -> str:
    if isinstance(section, tuple):
        present = [name for name in section if name in data]
        return (
            f"its sections {', '.join(present)}" if present else "none of its sections is one of " + ", ".join(section)
        )
    if section is None:
        return "the whole file"
    if section in data:
        return f"its `{section}:` section"
    return f"the whole file, because it has no `{section}:` section" + (
        f"; its sections are {', '.join(map(str, data))}" if data else ""
    )


def key_line(path: Path, loc: tuple, seen: tuple = (), roots: dict | None = None) -> tuple[Path, int] | None:
    """(file, 1-based line) of the deepest key of `loc` the file sets, else the `base:` file that sets it.
    Parts the YAML does not have (a union's tag in pydantic's path) are passed over. `roots`: files composed
    already, by path."""
    roots = {} if roots is None else roots
    if path not in roots:
        try:
            roots[path] = yaml.compose(path.read_text())
        except (OSError, yaml.YAMLError):
            roots[path] = None
    root = roots[path]
    if root is None:
        return None
    line, whole = _deepest(root, loc)
    base = _base_of(root, path)
    if base is not None and base not in seen and (line is None or len(loc) > 1 and not whole):
        found = key_line(base, loc, seen + (path,), roots)
        if found:
            return found
    return (path, line) if line else None


def _deepest(root, loc: tuple) -> tuple[int | None, bool]:
    """(1-based line of the deepest part of `loc` this YAML sets, whether it sets every key of `loc`)."""
    node, line, whole = root, None, True
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((key, value) for key, value in node.value if key.value == str(part)), None)
            if match:
                node, line = match[1], match[0].start_mark.line + 1
            else:
                whole = False
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node, line = node.value[part], node.value[part].start_mark.line + 1
    return line, whole


def named_line(path: Path, message: str, roots: dict | None = None) -> tuple[Path, int] | None:
    """A cross-field rule's error has no field of its own: the line of the first `section.field` it names."""
    for dotted in re.findall(r"\b([a-z_]+(?:\.[a-z_]+)+)\b", message):
        found = key_line(path, tuple(dotted.split(".")), roots=roots)
        if found:
            return found
    return None


def _base_of(root, path: Path) -> Path | None:
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "base" and isinstance(value, yaml.ScalarNode):
                return (path.parent / value.value).resolve()
    return None


def closest_field(name: str, model: type[BaseModel], loc: tuple) -> str | None:
    """The valid field nearest in spelling to `name`, among the fields of the config(s) at `loc`."""
    fields = {field for candidate in models_at(model, loc) for field in candidate.model_fields}
    found = difflib.get_close_matches(name, sorted(fields - {name}), n=1, cutoff=0.6)
    return found[0] if found else None


def models_at(model: type[BaseModel], loc: tuple) -> list[type[BaseModel]]:
    """The config classes a path can land in (a list's index and a union's tag are passed over)."""
    current = [model]
    for part in loc:
        following = [
            inner
            for candidate in current
            if part in candidate.model_fields
            for inner in _models_in(candidate.model_fields[part].annotation)
        ]
        current = following or current
    return current


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if (
        isinstance(annotation, (types.UnionType, typing._GenericAlias, typing._UnionGenericAlias))
        or typing.get_origin(annotation) is not None
    ):
        return [model for argument in typing.get_args(annotation) for model in _models_in(argument)]
    return []
