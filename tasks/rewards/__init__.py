"""Reward composition and the reward signals beyond verifiers.

May import: tasks.config only (the `independent-stages` contract)."""
