"""Reward composition and the reward signals beyond verifiers.

May import: storage.config and tasks.tripwires only (the `independent-stages` contract)."""
