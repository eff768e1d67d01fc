"""A vLLM worker extension: a model version's full weights swapped in place from a checkpoint folder.

Start vLLM with `--worker-extension-cls rlvr_weights.CheckpointLoader` (this folder on PYTHONPATH) and
`VLLM_SERVER_DEV_MODE=1`; the publish stage then calls, through `POST /collective_rpc`,
`rlvr_load_checkpoint(folder, version)` on every worker, `POST /reset_prefix_cache`, and
`rlvr_loaded_version()` to confirm (`policy/publish.py`). `infra/vllm/serve.sh WEIGHTS=full`
sets all of it. It needs only torch and safetensors, which vLLM has; nothing of the project.

vLLM mixes this class into its worker class and refuses names the worker has already (0.16+ has
`update_weights` and `reload_weights`), hence the `rlvr_` prefix. vLLM's `/collective_rpc` answers
`str(result)` for anything but None, a dict or a list, so the version goes back as "5"; clients read it so.

The load, in order of preference (each tried, the next only when the one before is not there or refuses
its arguments, and the error names every one that failed):
1. vLLM's in-place reload, `reload_weights(weights_path=..., is_checkpoint_format=True)` (0.16+), found
   where vLLM defines those arguments: on the model runner (0.32: `GPUModelRunner.reload_weights`; the
   worker's own `reload_weights(*args, **kwargs)` only forwards). It loads layer by layer and runs vLLM's
   post-processing again (repacked CPU weights, fp8 and other quantized kernels);
2. the model's `load_weights` with the checkpoint's tensors (HF names, as vLLM's loader reads them), for
   older vLLM where the model's parameters are plain tensors.

Tied embeddings (Qwen2.5-0.5B/1.5B, the project's tiny policy): the checkpoint has no `lm_head.weight`, so
the reload leaves the output layer's processed form (vLLM CPU keeps a packed copy of the weight in
`cpu_linear`) at the old version's values; the extension processes the output layer again from the new
embedding, so that logits come from the version just loaded, on the CPU build as on a GPU.
"""

from __future__ import annotations

import glob
import inspect
import os


def checkpoint_tensors(folder: str):
    """(name, tensor) of every tensor of the folder's safetensors shards, one at a time, on the CPU."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors file (is it a full checkpoint the server can read?)")
    for file in files:
        with safe_open(file, framework="pt") as shard:
            for name in shard.keys():
                yield name, shard.get_tensor(name)


def names_weights_path(method) -> bool:
    """Whether `method` takes `weights_path` itself (a `*args, **kwargs` forwarder does not say)."""
    try:
        return "weights_path" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def tied_output_layer(model):
    """The output layer when it shares its weight with the input embedding, else None."""
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embedding = getattr(inner, "embed_tokens", None)
    head_weight, embedding_weight = getattr(head, "weight", None), getattr(embedding, "weight", None)
    if head_weight is None or embedding_weight is None:
        return None
    shared = head_weight is embedding_weight or (
        head_weight.shape == embedding_weight.shape
        and head_weight.numel()
        and head_weight.data_ptr() == embedding_weight.data_ptr()
    )
    config = getattr(model, "config", None)
    return head if shared or getattr(config, "tie_word_embeddings", False) else None


class CheckpointLoader:
    """Mixed into vLLM's worker: `self` is the worker (`self.model_runner`, `self.device`)."""

    def rlvr_load_checkpoint(self, folder: str, version: int) -> None:
        """Load the full checkpoint at `folder` (as model version `version`) into this worker's model."""
        import torch

        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{folder}: no such checkpoint folder on this server")
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        failures = []
        loaded = False
        if names_weights_path(getattr(runner, "reload_weights", None)) or names_weights_path(
            getattr(self, "reload_weights", None)
        ):
            reload = getattr(self, "reload_weights", None) or runner.reload_weights  # the worker sets vLLM's config
            try:
                reload(weights_path=folder, is_checkpoint_format=True)
                loaded = True
            except TypeError as error:  # an API that moved: try the next way, say why
                failures.append(f"reload_weights(weights_path=...): {error}")
        if not loaded:
            try:
                model.load_weights(weights=checkpoint_tensors(folder))
            except Exception as error:
                failures.append(f"model.load_weights: {type(error).__name__}: {error}")
                raise RuntimeError(f"cannot load {folder} into this vLLM worker: " + "; ".join(failures)) from error
        head = tied_output_layer(model)
        if head is not None:
            refresh_output_layer(model, head)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.rlvr_version = int(version)

    def rlvr_loaded_version(self) -> int:
        """The version this worker holds: the last loaded, else the base's (`RLVR_BASE_VERSION`, default 0)."""
        return getattr(self, "rlvr_version", int(os.environ.get("RLVR_BASE_VERSION", "0")))


def refresh_output_layer(model, head) -> None:
    """Point a tied output layer at the embedding again and redo its post-processing (vLLM CPU packs the
    weight into the layer's `cpu_linear`), so the logits use the new embedding."""
    embedding = model.model.embed_tokens
    if head.weight is not embedding.weight:
        head.weight = embedding.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
