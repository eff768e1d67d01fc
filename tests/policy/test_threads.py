"""torch's thread count follows the cores a process is given, or RLVR_TORCH_THREADS."""

import os

import pytest
import torch

from policy.threads import cores_given, torch_threads, use_given_cores


def test_the_thread_count_is_the_cores_given_unless_overridden(monkeypatch):
    monkeypatch.delenv("RLVR_TORCH_THREADS", raising=False)
    assert torch_threads() == cores_given() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("RLVR_TORCH_THREADS", "1")
    before = torch.get_num_threads()
    try:
        assert use_given_cores() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    for bad in ("two", "0"):
        monkeypatch.setenv("RLVR_TORCH_THREADS", bad)
        with pytest.raises(ValueError, match="RLVR_TORCH_THREADS"):
            torch_threads()
