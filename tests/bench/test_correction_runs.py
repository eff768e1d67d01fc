"""`rlvr bench correction`'s report, read from a loop's lake: the replay of the run's own correction on its
stored rows against what the step measured while training (here on the CPU sampler, whose gap is rounding)."""

import pytest


@pytest.mark.parametrize(
    "correction", [{"mode": "sequence_mask"}, {"mode": "icepop", "low": 0.999999, "high": 1.000001}]
)
def test_the_report_replays_each_iteration_as_the_step_measured_it(prefect_api, tmp_path, correction):
    from helpers import RUN, curated_with_eval

    from bench.correction_runs import run_report
    from flows.loop import rl_loop
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    settings = {
        **RUN,
        "advantages": {**RUN.get("advantages", {}), "off_policy_weight": "none"},
        "train": {**RUN["train"], "rollout_correction": correction},
        "loop": {"iterations": 1},
    }
    rl_loop(settings, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    report = run_report(lake, correction)
    assert [iteration for iteration, _, _ in report["replayed"]] == [1]
    assert report["replay_max_difference"] < 1e-12
    assert report["rollouts_kept"] == lake.read("batches")["rollout_id"].n_unique()
    assert report["curve"] and set(report["every_mode_at_defaults"]) >= {"token_tis", "icepop"}
