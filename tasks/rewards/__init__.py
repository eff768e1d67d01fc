"""Reward composition and the reward signals beyond verifiers."""
