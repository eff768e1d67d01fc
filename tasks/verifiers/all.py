"""Importing this module registers every verifier."""

from tasks.verifiers import code, controls, formats, gym, math, process, qa  # noqa: F401
