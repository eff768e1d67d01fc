"""Training: the GRPO / DAPO loss (`loss.py`) and step (`grpo.py`), the model a step trains (`trainable.py`), its
persistent trainer ranks on torch.distributed (`workers.py`, `distributed.py`), the supervised warm-up's optimiser
steps (`warmup.py`; the warm-up stage that wires them to the bank and the evaluation is `flows/warmup.py`), and the
training stage over the lake (`stage.py`), which registers each trained version with its lineage.

May import: `tasks`, `policy` and `storage` (the `floors` contract); never Prefect, Typer, `flows` or `bench`."""
