"""Policy checkpoints: saving and loading model versions as HF checkpoints in the lake's storage.

What every stage that touches a model reads, so it sits on the storage floor: the registry's rows (which versions
exist, their parents, where their checkpoints are) are `storage/registry.py`'s; this module writes and reads the
checkpoint folders they point at. A LoRA adapter checkpoint names the base checkpoint it applies to; checkpoints
on S3 are downloaded once into a local cache, and the versions this process has just written or read are kept in
memory (`policy/cache.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

from policy import cache as policy_cache
from policy.threads import use_given_cores
from storage.lake import Lake
from storage.location import s3_filesystem
from storage.registry import claim_checkpoint

# transformers' from_pretrained changes process-wide state while it builds a model (it disables
# `PreTrainedModel.tie_weights` and sets torch's default dtype, then restores them): a model built in another
# thread meanwhile comes out untied, its output layer left on the meta device ("Cannot copy out of meta tensor"),
# and two overlapping restores can leave tying off for good. The overlapped loop loads policies from two threads,
# so every model this process builds is built under this lock.
MODEL_BUILDING = threading.RLock()

CACHE_DIR = Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr")) / "checkpoints"


def _quiet_transformers() -> None:
    """No per-shard progress bars: the stages show their own progress."""
    from transformers.utils import logging

    logging.disable_progress_bar()


TRAINING_STATE = "training_state.pt"


def save_checkpoint(
    lake: Lake,
    version: int,
    model,
    tokenizer,
    training_state: dict | None = None,
    adapter_of: str | None = None,
    state_dict: dict | None = None,
    cache: bool = True,
) -> str:
    """Write model, tokenizer (and the optimizer's state, so training continues where it stopped) to
    the lake's storage; returns the checkpoint URI. A peft model saves its LoRA adapter only, with
    the URI of the base checkpoint it applies to (`adapter_of`), which is what vLLM hot-loads.
    `state_dict`: the weights to write instead of the model's own (a sharded model's, gathered);
    `cache: False` for a model that goes on training in place (a trainer rank's)."""
    import torch

    _quiet_transformers()
    uri = claim_checkpoint(lake, version)

    def write(folder: str) -> None:
        model.save_pretrained(folder, **({"state_dict": state_dict} if state_dict is not None else {}))
        tokenizer.save_pretrained(folder)
        if training_state is not None:
            torch.save(training_state, os.path.join(folder, TRAINING_STATE))
        if adapter_of is not None:
            with open(os.path.join(folder, ADAPTER_BASE), "w") as handle:
                json.dump({"base_checkpoint": adapter_of}, handle)

    if not lake.location.is_s3:
        write(uri)
        if adapter_of is None and state_dict is None and cache:  # the loop loads it again at once: to sample, to train
            policy_cache.remember("policy", uri, (model, tokenizer))
            if training_state is not None:
                policy_cache.remember("training_state", uri, training_state)
        return uri
    with tempfile.TemporaryDirectory() as local:
        write(local)
        fs = lake.location.filesystem
        for name in os.listdir(local):
            fs.put_file(os.path.join(local, name), f"{uri}/{name}")
    return uri


def local_checkpoint(uri: str) -> str:
    """A local folder holding the checkpoint (downloading an s3:// one into the cache once)."""
    if not uri.startswith("s3://"):
        if not os.path.isdir(uri):
            raise FileNotFoundError(f"checkpoint folder {uri} does not exist")
        return uri

    fs = s3_filesystem()
    remote = uri.removeprefix("s3://")
    stamps = [
        str(fs.info(path).get("ETag", ""))
        for path in sorted(fs.ls(remote, detail=False))
        if path.endswith((".safetensors", ".json", ".pt"))
    ]
    key = "\n".join([os.environ.get("AWS_ENDPOINT_URL", ""), uri, *stamps])  # a rebuilt lake is a new key
    target = CACHE_DIR / hashlib.sha1(key.encode()).hexdigest()[:16]
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent))
        for path in fs.ls(remote, detail=False):
            fs.get_file(path, str(staging / path.rsplit("/", 1)[1]))
        try:
            os.replace(staging, target)
        except OSError:  # another process finished the download first
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


ADAPTER_BASE = "base_checkpoint.json"


@contextmanager
def peft_warnings_quiet():
    """peft 0.21 still reads an attribute transformers 5 deprecates (a FutureWarning per model)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def adapter_base(uri: str) -> str | None:
    """The base checkpoint a LoRA adapter checkpoint applies to; None for a full checkpoint."""
    path = os.path.join(local_checkpoint(uri), ADAPTER_BASE)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)["base_checkpoint"]


def import_model_code() -> None:
    """Import transformers' model and tokenizer classes now, in this thread, before other threads load
    policies: its lazy module is not safe to import from two threads at once (the overlapped loop's
    trainer once failed with `cannot import name 'AutoModelForCausalLM' from 'transformers'`)."""
    from transformers import (  # noqa: F401
        AutoModelForCausalLM,
        AutoTokenizer,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )


def load_policy(uri: str, device: str = "cpu", trainable_adapter: bool = False, read_only: bool = False):
    """(model, tokenizer) from a checkpoint URI, in eval mode.

    A LoRA adapter checkpoint is applied to its base: merged into it for sampling, or kept as a
    trainable adapter (`trainable_adapter`) so that training continues the same adapter. `read_only`: the
    caller only samples from the model, never changes it, so a CPU model held in memory is handed over as it
    is, not copied (on another device, `.to` would move the kept one).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    use_given_cores()  # every torch stage loads a policy first
    folder = local_checkpoint(uri)
    base = adapter_base(uri)
    shared = read_only and device == "cpu"
    kept = policy_cache.recall("policy", folder, shared) if base is None else None  # a full checkpoint held in memory
    if kept is not None:
        model, tokenizer = kept
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.padding_side = "left"
        if base is None:
            with MODEL_BUILDING:
                model = AutoModelForCausalLM.from_pretrained(folder)
            policy_cache.remember("policy", folder, (model, tokenizer))
        else:
            from peft import PeftModel

            base_model, _ = load_policy(base)
            with MODEL_BUILDING, peft_warnings_quiet():
                model = PeftModel.from_pretrained(base_model, folder, is_trainable=trainable_adapter)
            if not trainable_adapter:
                model = model.merge_and_unload()
    return model.to(device).eval(), tokenizer


def load_tokenizer(uri: str):
    """The tokenizer of a checkpoint alone (a sampler on a server needs it for chat templates and tool output)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_checkpoint(uri))


def load_training_state(uri: str) -> dict | None:
    """The optimizer state saved with a checkpoint, or None (a base model)."""
    import torch

    folder = local_checkpoint(uri)
    path = os.path.join(folder, TRAINING_STATE)
    if not os.path.exists(path):
        return None
    kept = policy_cache.recall("training_state", folder)
    # map to CPU: AdamW's load_state_dict moves the state onto the parameters' device (a GPU run's state loads on CPU)
    return kept if kept is not None else torch.load(path, map_location="cpu", weights_only=True)
