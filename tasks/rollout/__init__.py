"""On-policy rollout: policy backends (in-process transformers, OpenAI-compatible servers), prompt
templates, and the stage that samples groups from the bank into the `rollouts` table."""
