"""`rlvr bench peer`'s own logic: both sides' settings from one config (and a config TRL cannot mirror refused),
what TRL will really run read back from its GRPOConfig, the paired intervals, and time to accuracy."""

import os

import pytest
from conftest import ROOT, run_cli

from bench.peer import in_mode, isolated
from bench.peer_stats import T_975, interval, mean_curve, time_to_accuracy
from bench.peer_trl import CannotMirror, check_trl_arguments, mirror, trl_arguments, trl_layout
from flows.run_config import RunConfig, load_run_config


@pytest.fixture
def learning_config():
    return load_run_config(ROOT / "configs/demo-learn.yaml")


def test_the_learning_config_is_mirrored_and_trl_runs_exactly_it(learning_config, tmp_path):
    mirrored = mirror(learning_config)
    rows = {name: (ours, trl) for name, ours, trl in mirrored["rows"]}
    assert rows["responses per prompt (G)"] == (8, 8) and rows["clip ε low / high"] == ((0.2, 0.28), (0.2, 0.28))
    assert rows["loss aggregation"] == ("dapo", "dapo") and rows["advantage scaling"] == ("grpo", "group")
    assert mirrored["rollouts_per_step"] == 32 * 8  # a number, not read back from a row's text
    for fractions in ((1, 1, 1), (4, 4, 4), (2, 2, 4)):
        layout = trl_layout(learning_config, fractions)
        assert layout["per_device_train_batch_size"] * layout["gradient_accumulation_steps"] == 32 * 8
        args = trl_arguments(mirrored, layout, 0, 50, str(tmp_path))  # checks TRL runs what we asked
        assert args.generation_batch_size == layout["per_device_train_batch_size"] * layout["steps_per_generation"]
        args.top_p = 0.9  # TRL quietly running something else is caught
        with pytest.raises(CannotMirror, match="top_p: ours 1.0, TRL runs 0.9"):
            check_trl_arguments(args, mirrored)


def test_a_config_trl_cannot_mirror_is_refused_naming_each_field(learning_config, tmp_path):
    config = learning_config.model_copy(deep=True)
    config.advantages.estimator = "rloo"
    config.train.beta = 0.05
    config.rollout.sampler.stop = ["\n\n"]
    with pytest.raises(CannotMirror) as refused:
        mirror(config)
    for field in ("advantages.estimator rloo", "train.beta", "rollout.sampler.stop"):
        assert field in str(refused.value)
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"base: {ROOT / 'configs/demo-learn.yaml'}\nadvantages:\n  estimator: rloo\n")
    result = run_cli("bench", "peer", "--config", str(mine), "--work", str(tmp_path / "work"))
    assert result.returncode == 2 and "advantages.estimator rloo" in result.stderr
    assert not (tmp_path / "work").exists()  # refused before any work


def test_ours_overlapped_mode_takes_the_async_objective_and_changes_nothing_else(learning_config):
    """The sweep's `async` copy runs the overlapped loop's decoupled objective (a valid run config), the `sync` copy
    only the mode; a config with its own decoupled loss keeps it, and the config given is not touched. (On a step's
    own rollouts the decoupled loss trains as the plain one: tests/trainers/test_training.py.)"""
    overlapped, in_turn = in_mode(learning_config, "async"), in_mode(learning_config, "sync")
    assert overlapped.loop.mode == "async" and overlapped.train.off_policy_loss == "decoupled"
    assert overlapped.advantages.off_policy_weight == "none"
    RunConfig.model_validate(overlapped.model_dump(mode="json"))
    assert in_turn.model_dump() == learning_config.model_copy(update={"loop": in_turn.loop}).model_dump()
    assert in_turn.loop.mode == "sync" and in_turn.train.off_policy_loss == learning_config.train.off_policy_loss
    assert learning_config.loop.mode == "sync" and learning_config.train.off_policy_loss != "decoupled"
    own = learning_config.model_copy(deep=True)
    own.train.off_policy_loss, own.advantages.off_policy_weight, own.train.importance_cap = "decoupled", "none", 3.0
    assert in_mode(own, "async").train.importance_cap == 3.0


def test_intervals_are_students_t_over_the_seeds():
    mean, half = interval([0.50, 0.52, 0.48, 0.51, 0.49])
    assert mean == pytest.approx(0.50)
    assert half == pytest.approx(T_975[4] * 0.015811388 / 5**0.5, rel=1e-6)
    assert interval([0.4]) == (0.4, 0.0)


def test_time_to_accuracy_interpolates_between_checkpoints():
    curve = [(0.0, 0.40), (10.0, 0.44), (20.0, 0.50), (30.0, 0.49)]
    assert time_to_accuracy(curve, 0.47) == pytest.approx(15.0)  # halfway from 44 % to 50 %
    assert time_to_accuracy(curve, 0.44) == pytest.approx(10.0)
    assert time_to_accuracy(curve, 0.40) == 0.0
    assert time_to_accuracy(curve, 0.55) is None  # never reached
    runs = [
        {"curve": {10: 0.44, 20: 0.50}, "elapsed": {10: 9.0, 20: 19.0}},
        {"curve": {10: 0.46, 20: 0.52}, "elapsed": {10: 11.0, 20: 21.0}},
    ]
    assert mean_curve(runs, 0.40) == [(0.0, 0.40), (10.0, pytest.approx(0.45)), (20.0, pytest.approx(0.51))]


def test_each_sides_run_gets_a_fresh_process_of_its_own(prefect_api, monkeypatch):
    """A run leaves nothing in the process the next run times (after ours' overlapped loop, TRL's steps ran ~17 %
    slower in the same process): each call is a new process, not this one and not the last one."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # the child's started_once reports to the test's server
    first, second = isolated(os.getpid), isolated(os.getpid)
    assert len({first, second, os.getpid()}) == 3


def test_the_summary_measures_ours_against_the_fixed_arm_seed_by_seed():
    """Rollouts per kept group as a ratio to the fixed-oversampling arm, per seed and over the means, and the
    held-out difference paired by seed, with what selection retired and revisited."""
    from rich.console import Console

    from bench.peer import summarize

    def run(curve, per_kept, revisited):
        sampling = {
            "rollouts": 100.0,
            "kept_groups": 10.0,
            "per_kept_group": per_kept,
            "per_step": 50.0,
            "rounds_per_step": 1.0,
            "revisited": revisited,
            "bank_problems": 512,
            "distinct_problems_drawn": 400,
            "retired_at_end": revisited * 2,
            "predicted_uniform_at_end": 1,
        }
        return {
            "curve": dict(zip((10, 20), curve)),
            "elapsed": {10: 10.0, 20: 20.0},
            "rl_seconds": 20.0,
            "sampling": sampling,
            "lake_intact": True,
            "stages": {"rollout": 1.0},
            "outside": 0.0,
        }

    results = {
        "ours": [run((0.50, 0.60), 9.0, 4), run((0.48, 0.58), 10.0, 6)],
        "fixed": [run((0.46, 0.52), 12.0, 0), run((0.46, 0.54), 12.5, 0)],
        "trl": [{"curve": {10: 0.45, 20: 0.50}, "elapsed": {10: 10.0, 20: 20.0}, "rl_seconds": 20.0}] * 2,
    }
    layouts = {"fastest": {"per_device_train_batch_size": 8}, "layouts": []}
    summary = summarize(results, 0.4, 20, [0, 1], layouts, {"rows": [], "rollouts_per_step": 256}, Console(quiet=True))
    against = summary["against_fixed"]
    assert against["per_kept_group_ratio"] == pytest.approx(9.5 / 12.25)
    assert against["per_kept_group_ratio_by_seed"] == pytest.approx([9.0 / 12.0, 10.0 / 12.5])
    assert against["paired_difference"]["20"]["mean"] == pytest.approx(0.06)
    assert against["paired_difference"]["20"]["half_width"] == pytest.approx(interval([0.08, 0.04])[1])
    assert summary["sampling"]["ours"]["revisited"] == 5 and summary["sampling"]["ours"]["retired_at_end"] == 10
