"""Training: the GRPO / DAPO loss (`loss.py`) and step (`grpo.py`), the model a step trains (`trainable.py`), its
persistent trainer ranks on torch.distributed (`workers.py`, `distributed.py`), the supervised warm-up (`warmup.py`), and their stage functions over the
lake (`stage.py`), which register each trained version with its lineage.

May import: `tasks`, `policy` and `storage` (the `floors` contract); never Prefect, Typer, `flows` or `bench`."""
