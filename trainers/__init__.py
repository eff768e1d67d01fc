"""Policy loading and saving, the GRPO/DAPO loss and step, the model registry (built by later issues)."""
