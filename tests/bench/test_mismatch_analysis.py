"""The synthetic `mismatch` table `rlvr bench mismatch-analysis` times: its figures are the training stage's own
for the same log-ratios, and the command it times answers on it."""

import numpy as np
import polars as pl
import pytest
import torch

from bench.mismatch_analysis import report_modes, synthetic_mismatch, timed_command, write_lake
from policy.logprobs import right_padded
from trainers.correction import RolloutCorrection
from trainers.mismatch import mismatch_rows


def test_the_synthetic_rows_carry_the_figures_the_step_computes():
    rows = synthetic_mismatch(2000, 1, 12, 64, np.random.default_rng(1))
    delta, mask = right_padded(rows["log_ratio"].to_list(), dtype=torch.float64)
    step = pl.DataFrame(mismatch_rows(rows["rollout_id"].to_list(), delta, mask, RolloutCorrection(), 0))
    assert step["n_tokens"].to_list() == rows["n_tokens"].to_list()
    for name in ("mean_abs_delta", "max_abs_delta", "sequence_log_ratio", "kl_k3", "outside_share"):
        assert rows[name].to_list() == pytest.approx(step[name].to_list(), abs=1e-12), name
    assert 0 < rows["outside_share"].sum()  # some tokens are past ×3


def test_the_timed_command_replays_the_written_lake(tmp_path):
    uri = str(tmp_path / "lake")
    tokens = write_lake(uri, 3000, 3, 12, 64)
    seconds, report = timed_command("analyze", "mismatch", "--lake", uri, "--format", "json")
    modes = report_modes(report)
    assert tokens > 3000 and seconds > 0
    assert set(modes) == {"token_tis", "sequence_tis", "token_mask", "sequence_mask", "geometric", "icepop"}
    assert 0 < modes["sequence_mask"] < 1  # one token in twenty is 0.5 nat off: some sequences pass ×3
