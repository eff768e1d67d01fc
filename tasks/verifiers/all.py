"""Importing this module registers every verifier."""

from tasks.verifiers import (code, controls, formats, games, gym, judge, math, process, qa, sat, selfplay,  # noqa: F401
                            translation, workspace)
