"""The adaptive curriculum: keep the level mix where GRPO's groups carry signal.

May import: storage, storage.config, tasks.curation, tasks.generators."""
