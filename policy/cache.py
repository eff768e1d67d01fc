"""Checkpoints this process has just written or read, kept in memory.

The loop loads the version it trained a moment ago twice (to sample from it, then to train it
further), and rebuilding a model from its files (module construction, weight init, reading the
safetensors) costs more than copying one already in memory. Entries are keyed by the checkpoint
folder and the size and modification time of every file in it, so a folder rewritten (a lake
rebuilt at the same path) is a miss; every hit is a deep copy, so a caller that trains its model
in place never changes what the next caller gets. Local folders and CPU tensors only; large models are not kept.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import OrderedDict
from typing import Any

ENTRIES = 4  # a policy and an optimizer state for each of the last two versions
MAX_PARAMETERS = 50_000_000  # bigger models are not kept: a copy beside the one in use costs too much memory

_KEPT: OrderedDict[tuple[str, str], tuple[tuple, Any]] = OrderedDict()
_LOCK = threading.Lock()


def folder_stamp(folder: str) -> tuple:
    """What identifies the checkpoint in a folder: each file's name, size and modification time (files named
    `_*` are bookkeeping, not the checkpoint: the registry's claim is rewritten when the version registers)."""
    entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    return tuple(
        (entry.name, entry.stat().st_size, entry.stat().st_mtime_ns)
        for entry in entries
        if entry.is_file() and not entry.name.startswith("_")
    )


def _tensors(value: Any):
    if hasattr(value, "parameters"):
        yield from value.parameters()
    elif isinstance(value, dict):
        for part in value.values():
            yield from _tensors(part)
    elif isinstance(value, (list, tuple)):
        for part in value:
            yield from _tensors(part)
    elif hasattr(value, "numel") and hasattr(value, "device"):
        yield value


def keepable(value: Any) -> bool:
    """Small, on the CPU, and not wrapped (accelerate's mixed-precision autocast replaces a model's forward)."""
    tensors = list(_tensors(value))
    models = [part for part in (value if isinstance(value, tuple) else (value,)) if hasattr(part, "parameters")]
    return (
        sum(t.numel() for t in tensors) <= MAX_PARAMETERS * 3
        and all(t.device.type == "cpu" for t in tensors)
        and all(
            sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS and "forward" not in vars(model)
            for model in models
        )
    )


def remember(kind: str, folder: str, value: Any) -> None:
    """Keep a copy of `value` (a (model, tokenizer) pair or an optimizer state) as what `folder` holds now."""
    if folder.startswith("s3://") or not os.path.isdir(folder) or not keepable(value):
        return
    entry = (folder_stamp(folder), copy.deepcopy(value))
    with _LOCK:
        _KEPT[(kind, folder)] = entry
        _KEPT.move_to_end((kind, folder))
        while len(_KEPT) > ENTRIES:
            _KEPT.popitem(last=False)


def recall(kind: str, folder: str, shared: bool = False) -> Any | None:
    """A copy of what `folder` was remembered to hold, or None if it was not, or its files changed since.
    `shared`: the kept object itself, for a caller that only reads it (a sampler, which loads once a loop
    step: a copy of the weights each time is avoidable work); it must not change it, or every later caller gets the change."""
    with _LOCK:
        entry = _KEPT.get((kind, folder))
    if entry is None or not os.path.isdir(folder) or entry[0] != folder_stamp(folder):
        return None
    return entry[1] if shared else copy.deepcopy(entry[1])


def forget() -> None:
    with _LOCK:
        _KEPT.clear()
