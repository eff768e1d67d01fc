"""The platform beside the trainers teams already use (TRL, verl, OpenRLHF): problems and batches written in each
trainer's own dataset format (`formats.py`, pure; `export.py` reads the lake and writes the files), and the
platform's verifiers as their reward functions (`rewards.py`); and experiment tracking, the loop's metrics and the
report's plots logged to MLflow and TensorBoard by a follower of the lake (`tracking.py`, pure; `trackers.py`).
Only the command line imports this package: the loop never runs it.

May import: storage, storage.config, tasks.curation, tasks.report, tasks.sampling (group statistics), tasks.verification.
"""
