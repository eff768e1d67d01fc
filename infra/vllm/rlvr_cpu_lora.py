"""A vLLM worker extension for the CPU build serving LoRA adapters: base-model rows stay base-model rows.

vLLM marks a token that uses no adapter with slot index -1. Its GPU kernels skip such rows
(`vllm/lora/ops/triton_ops`: `if lora_id == -1: return`); the CPU build's PyTorch ops
(`vllm/lora/ops/torch_ops/lora_ops.py`, 0.32) index the stacked adapter weights with it,
`lora_b_weights[lora_indices_tensor]`, and -1 picks the last slot. So whenever a base-model request shares a
step with adapter requests and the last of `--max-loras` slots holds an adapter, the base request is computed
with that adapter, and its samples and log-probs are not the base version's (in the overlapped loop, the base
version's samples drawn while the next version was gated; tests/policy/test_server_contract.py checks it).

Importing this module (vLLM imports a `--worker-extension-cls` in every worker process before it builds the
model) wraps those ops so that a row whose index is -1 gets no adapter term, which is what the GPU kernels
do. The class adds nothing to the worker. `infra/vllm/serve.sh` passes it on the CPU build with
`WEIGHTS=adapter`; it needs nothing of the project.
"""

from __future__ import annotations

import functools


def skipping_base_rows(op):
    """`op`, a bgmv op (inputs, weights, output, indices, ...), with the inputs of rows at index -1 zeroed: their
    adapter term is then 0 whichever slot -1 picks (the shrink writes 0, the expand adds 0), as on a GPU. A
    multiply rather than a selection of rows: no copy and no shape that depends on the batch."""

    @functools.wraps(op)
    def run(inputs, weights, output, indices, *args, **kwargs):
        if inputs.shape[0] != indices.shape[0]:  # not the layout these ops are written for: unchanged
            return op(inputs, weights, output, indices, *args, **kwargs)
        slotted = (indices >= 0).unsqueeze(1).to(inputs.dtype)
        return op(inputs * slotted, weights, output, indices, *args, **kwargs)

    run.skips_base_rows = True
    return run


def patch() -> list[str]:
    """Wrap the CPU build's bgmv ops where they are looked up (the ops module, whose sgmv ops call them, and
    the CPU punica wrapper, which imported them by name); once. Returns the names wrapped."""
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:  # a build without the PyTorch LoRA ops: nothing to mend
        return []
    wrapped = []
    for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
        op = getattr(lora_ops, name, None)
        if op is None or getattr(op, "skips_base_rows", False):
            continue
        safe = skipping_base_rows(op)
        setattr(lora_ops, name, safe)
        if getattr(punica_cpu, name, None) is op:
            setattr(punica_cpu, name, safe)
        wrapped.append(name)
    return wrapped


WRAPPED = patch()


class BaseRowsWithoutAdapter:
    """The worker extension's class: the import above is the whole effect."""
