"""How one training step reaches its devices: one process through accelerate, or one rank of several on
torch.distributed with DistributedDataParallel or FSDP2 (`train.strategy`).

The step (`trainers/grpo.py`) is written once against `Placement`: prepare the model, autocast, backward,
accumulate without syncing until a mini-batch's last micro-batch, clip, sum figures over ranks, and gather
the full weights and optimizer state for the checkpoint. DDP and FSDP both average gradients over ranks;
the step's losses are sums over the whole mini-batch's tokens (or sequences) divided by its size, so each
rank's loss is multiplied by the world size (`loss_scale`) and the averaged gradient is the sum.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext


class SingleDevice:
    """One process: accelerate places the model, autocasts and scales fp16 losses."""

    rank, world, loss_scale = 0, 1, 1.0
    shares_prompts = True  # a micro-batch may forward a group's prompt once, then its responses

    def __init__(self, device: str, mixed_precision: str):
        from accelerate import Accelerator

        self.accelerator = Accelerator(cpu=device == "cpu", mixed_precision=mixed_precision)
        self.device = self.accelerator.device

    def prepare(self, model, optimizer):
        return self.accelerator.prepare(model, optimizer)

    def autocast(self):
        return self.accelerator.autocast()

    def backward(self, loss) -> None:
        self.accelerator.backward(loss)

    def accumulating(self, model, last: bool):
        return nullcontext()

    def clip(self, parameters: list, max_norm: float) -> float:
        return float(self.accelerator.clip_grad_norm_(parameters, max_norm))

    def sum(self, values: list[float]) -> list[float]:
        return values


class Distributed:
    """One rank of `world` on an initialised process group: DDP (a full copy each, gradients all-reduced) or
    FSDP2 (`fully_shard` per decoder layer and the whole model: parameters, gradients and optimizer state
    sharded, gathered layer by layer for each forward and backward)."""

    shares_prompts = False  # DDP and FSDP hook one forward per backward: a micro-batch forwards each row whole

    def __init__(self, strategy: str, device: str, mixed_precision: str):
        import torch
        import torch.distributed as dist

        self.strategy, self.device = strategy, torch.device(device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.loss_scale = float(self.world)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)

    def wrap(self, model):
        """The model on this rank's device, wrapped once for the run (the optimizer is built on the result)."""
        model = model.to(self.device)
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                gradient_as_bucket_view=True,
            )  # no second copy of the gradients
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model

    def prepare(self, model, optimizer):
        return model, optimizer

    def autocast(self):
        import torch

        return torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else nullcontext()

    def backward(self, loss) -> None:
        loss.backward()

    @contextmanager
    def accumulating(self, model, last: bool):
        """Gradients reduced over ranks only on a mini-batch's last micro-batch."""
        if self.strategy == "ddp":
            with nullcontext() if last else model.no_sync():
                yield
        else:
            model.set_requires_gradient_sync(last)
            yield

    def clip(self, parameters: list, max_norm: float) -> float:
        import torch

        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def sum(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def full_state(self, model, optimizer) -> tuple[dict | None, dict]:
        """(model state dict or None, optimizer state with parameters by name), whole and on the CPU, for rank 0's
        checkpoint. DDP: every rank holds them already (None: the module saves its own weights). FSDP: gathered
        from the shards, a collective every rank calls."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        if self.strategy == "ddp":
            return None, named_optimizer_state(optimizer.state_dict(), trainable_names(model))
        return get_state_dict(
            unwrapped(model), optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer(self, model, optimizer, state: dict) -> None:
        """A checkpoint's whole optimizer state (parameters by index, as `optimizer.state_dict()` has them),
        copied (DDP) or sharded (FSDP) onto this rank."""
        if self.strategy == "ddp":
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            unwrapped(model),
            optimizer,
            named_optimizer_state(state, trainable_names(model)),
            options=StateDictOptions(full_state_dict=True),
        )


def trainable_names(model) -> list[str]:
    """The trainable parameters' names in the optimizer's order (how a checkpoint's optimizer state indexes them)."""
    return [name for name, parameter in unwrapped(model).named_parameters() if parameter.requires_grad]


def named_optimizer_state(state: dict, names: list[str]) -> dict:
    """`optimizer.state_dict()` (parameters by index) with parameters by name, as torch.distributed.checkpoint's
    whole state dicts hold them."""
    return {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]} for group in state["param_groups"]
        ],
    }


def indexed_optimizer_state(state: dict, names: list[str]) -> dict:
    """The inverse of `named_optimizer_state`: what `optimizer.load_state_dict` of one process takes."""
    position = {name: index for index, name in enumerate(names)}
    return {
        "state": {position[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]} for group in state["param_groups"]
        ],
    }


def unwrapped(model):
    """The module under a DDP wrapper (FSDP2 shards in place: the model is its own module)."""
    return getattr(model, "module", model)


def decoder_layers(model) -> list:
    """The transformer blocks to shard one by one: every module named `layers` that is a list (through a peft
    wrapper too); none found: the model is sharded whole."""
    import torch

    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []
