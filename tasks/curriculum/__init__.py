"""The adaptive curriculum: keep the level mix where GRPO's groups carry signal."""
