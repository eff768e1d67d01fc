"""A vLLM worker extension: a model version's full weights swapped in place from a checkpoint folder.

Start vLLM with `--worker-extension-cls rlvr_weights.CheckpointLoader` (this folder on PYTHONPATH) and
`VLLM_SERVER_DEV_MODE=1`; the publish stage then calls, through `POST /collective_rpc`,
`rlvr_load_checkpoint(folder, version)` on every worker, `POST /reset_prefix_cache`, and
`rlvr_loaded_version()` to confirm (`tasks/rollout/publish.py`). `infra/vllm/serve.sh WEIGHTS=full`
sets all of it. It needs only torch and safetensors, which vLLM has; nothing of the project.

vLLM mixes this class into its worker class and refuses names the worker has already (0.16+ has
`update_weights` and `reload_weights`), hence the `rlvr_` prefix. Where the worker has vLLM's own
`reload_weights(weights_path=...)` (0.16+), that does the load, layer by layer, with vLLM's
post-processing; before it, the model's `load_weights` takes the checkpoint's tensors (HF names, as
vLLM's loader reads them), one at a time from CPU.
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


class CheckpointLoader:
    """Mixed into vLLM's GPU worker: `self` is the worker (`self.model_runner`, `self.device`)."""

    def rlvr_load_checkpoint(self, folder: str, version: int) -> None:
        """Load the full checkpoint at `folder` (as model version `version`) into this worker's model."""
        import torch

        reload = getattr(self, "reload_weights", None)
        if reload is not None and "weights_path" in inspect.signature(reload).parameters:
            reload(weights_path=folder, is_checkpoint_format=True)          # vLLM's own, 0.16+
        else:
            runner = self.model_runner
            model = runner.get_model() if hasattr(runner, "get_model") else runner.model
            model.load_weights(weights=checkpoint_tensors(folder))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.rlvr_version = int(version)

    def rlvr_loaded_version(self) -> int:
        """The version this worker holds: the last loaded, else the base's (`RLVR_BASE_VERSION`, default 0)."""
        return getattr(self, "rlvr_version", int(os.environ.get("RLVR_BASE_VERSION", "0")))
