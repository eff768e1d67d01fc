"""The adaptive curriculum: keep the level mix where GRPO's groups carry signal.

May import: storage, tasks.config, tasks.curation, tasks.generators."""
