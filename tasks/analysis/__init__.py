"""Analyses over the lake's tables that are pure functions of frames.

May import: tasks.advantages."""
