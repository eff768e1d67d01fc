"""Analyses over the lake's tables that are pure functions of frames.

May import: tasks.sampling (the learning zone, what counts as solved)."""
