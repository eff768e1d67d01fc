"""Reward composition and the reward signals beyond verifiers.

May import: tasks.config and tasks.tripwires only (the `independent-stages` contract)."""
