"""The self-play loop end to end on the tiny model (`rlvr run` with `selfplay.enabled`): proposals with their
verdicts and rewards, valid ones banked with their lineage back to the proposer's version and rollout, the
tripwire stopping the loop, and a kill -9 mid-iteration resumed without losing or repeating anything.

The model is a small tiny model warmed up until it has memorised a few proposals (the bare proposer prompts,
`selfplay.references: 0`, are the same in the bank's train and eval splits, on purpose): its first
iteration proposes some valid tasks, later ones mostly repeat them (duplicates), which the tripwire catches.
"""

import signal

import polars as pl
import pytest
import yaml

from tasks.proposals.code_tasks import learnability

pytestmark = pytest.mark.slow  # one self-play run, killed and resumed, shared by every test here

CONFIG = {
    "bank": {
        "sources": [
            {"kind": "generator", "name": "sp-solver", "generator": "selfplay_solver", "count": 6, "seed": 2},
            {"kind": "generator", "name": "sp-proposer", "generator": "selfplay_proposer_bare", "count": 12, "seed": 3},
            {
                "kind": "generator",
                "name": "sp-proposer-eval",
                "generator": "selfplay_proposer_bare",
                "count": 12,
                "seed": 3,
                "split": "eval",
            },
        ],
        "decontamination": {"enabled": False},
    },
    "rollout": {
        "group_size": 4,
        "base_policy": {"tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}},
        "prompt": {"template": "plain", "format": "{prompt}\n"},
        "sampler": {"max_new_tokens": 64},
    },
    "selfplay": {
        "enabled": True,
        "references": 0,
        "proposer_groups": 1,
        "proposer_group_size": 4,
        "solver_tasks": 2,
        "proposal_tokens": 160,
        "tripwire": {"after": 2, "min_valid_rate": 0.99},
    },  # iteration 2 repeats iteration 1's tasks
    "dynamic_sampling": {"band": [-0.1, 1.1], "groups_per_batch": 32, "max_rounds": 1, "oversample": 1.0},
    "verify": {"workers": 0},
    "warmup": {
        "enabled": True,
        "band": [0.5, 1.0],
        "max_steps": 800,
        "evaluate_every": 50,
        "eval_problems": 10,
        "batch_size": 9,
        "learning_rate": 3.0e-3,
        "lr_warmup_steps": 20,
        "max_new_tokens": 160,
    },
    "train": {"micro_batch_size": 16},
    "evaluation": {"max_problems": 10, "sampler": {"max_new_tokens": 160}},
    "loop": {"iterations": 3, "evaluate_every": 3},
}


@pytest.fixture(scope="module")
def played(prefect_api, tmp_path_factory):
    """A self-play run killed with SIGKILL once iteration 2's rollouts are committed, then resumed until the
    tripwire stops it after iteration 2: (bench, lake uri, the resumed run)."""
    from bench.faults import Bench

    work = tmp_path_factory.mktemp("selfplay")
    bench = Bench(work / "bench", prefect_api=prefect_api)
    path = work / "self-play.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    lake_uri = bench.lake("local", "self-play")
    killed = bench.rlvr("run", "--config", str(path), "--lake", lake_uri, fault="committed:rollout:rollouts@2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = bench.rlvr("run", "--config", str(path), "--lake", lake_uri)
    return bench, lake_uri, resumed


def test_the_tripwire_stops_the_loop_with_what_fired(played):
    from storage.lake import Lake

    _, lake_uri, resumed = played
    assert resumed.returncode == 1
    assert "self-play stopped after iteration 2: valid-proposal rate" in resumed.stderr
    assert "below selfplay.tripwire.min_valid_rate 99%" in resumed.stderr
    recorded = Lake.open(lake_uri).read("iteration_metrics")["iteration"].sort().to_list()
    assert recorded == [0, 1, 2]  # the iteration that tripped it is recorded


def test_killed_and_resumed_nothing_is_lost_or_repeated(played):
    from bench.faults import lake_checks
    from storage.lake import Lake

    bench, lake_uri, _ = played
    checks = lake_checks(bench, lake_uri, 2)
    assert all(checks.values()), checks
    lake = Lake.open(lake_uri)
    proposals = lake.read("proposals")
    proposer_rollouts = lake.read("rollouts").filter(pl.col("round") == 1)
    assert proposals.group_by("iteration").len().sort("iteration")["len"].to_list() == [12, 12]
    assert sorted(proposals["rollout_id"]) == sorted(proposer_rollouts["rollout_id"])  # one per proposer rollout
    assert proposals["proposal_id"].is_unique().all()


def test_every_proposal_is_rewarded_by_its_rule_and_valid_ones_enter_the_bank(played):
    from storage.lake import Lake

    _, lake_uri, _ = played
    lake = Lake.open(lake_uri)
    proposals = lake.read("proposals")
    assert (proposals["verdict"] == "valid").any() and (proposals["reason"] == "duplicate").any()
    for row in proposals.iter_rows(named=True):
        expected = (
            learnability(row["solve_rate"])
            if row["verdict"] == "valid"
            else -1.0
            if row["reason"] == "unparseable"
            else -0.5
        )
        assert row["reward"] == pytest.approx(expected), row
    rewards = lake.read("rewards").join(proposals.select("rollout_id", "reward"), on="rollout_id", suffix="_proposal")
    assert (rewards["verifier"] == "learnability").all() and (rewards["reward"] == rewards["reward_proposal"]).all()
    valid = proposals.filter(pl.col("verdict") == "valid")
    banked = lake.read("problems").filter(pl.col("problem_id").is_in(valid["problem_id"].to_list()))
    assert banked.height == valid["problem_id"].n_unique()
    assert (banked["source"] == "self-play").all() and (banked["verifier"] == "selfplay").all()
    curated = lake.read("runs").filter(
        (pl.col("stage") == "curate") & pl.col("bank_version").is_in(banked["bank_version"].to_list())
    )
    assert (curated["status"] == "completed").all() and curated["iteration"].is_not_null().all()
    solved = lake.read("rewards").filter(pl.col("problem_id").is_in(valid["problem_id"].to_list()))
    assert (solved["verifier"] == "selfplay").all() and solved.height > 0


def test_lineage_walks_from_a_proposed_problem_to_its_proposer(played):
    from storage.lake import Lake

    bench, lake_uri, _ = played
    lake = Lake.open(lake_uri)
    proposal = lake.read("proposals").filter(pl.col("verdict") == "valid").sort("proposal_id").row(0, named=True)
    shown = bench.rlvr("lineage", "problem", proposal["problem_id"], "--lake", lake_uri)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert f"proposed as proposal:{proposal['proposal_id']} ({proposal['task_type']})" in text
    assert f"proposer model version {proposal['model_version']}" in text
    assert f"iteration {proposal['iteration']}, rollout {proposal['rollout_id']}" in text
    version = lake.read("model_versions").filter(pl.col("model_version") == proposal["model_version"])
    assert version.height == 1  # the proposer version is registered


def test_the_report_plots_self_play_health(played, tmp_path):
    from storage.lake import Lake
    from tasks.report.stage import build_report, write_report

    _, lake_uri, _ = played
    lake = Lake.open(lake_uri)
    result = write_report(build_report(lake, lake.runs_version()), tmp_path / "report")
    assert "self_play_health" in result["plots"] and "self_play_health" not in result["skipped"]
    assert (tmp_path / "report" / "self_play_health.png").stat().st_size > 5000


def test_read_only_commands_exit_cleanly_again_and_again(played):
    """Issue 37: `rlvr sql` once aborted at exit ("terminate called without an active exception", exit -6): Arrow
    threads freeing delta-rs's Python file handles while Python shut down (storage/arrow_reads.py). The read-only
    commands, three at a time (the abort needed a busy host), each must exit 0 with nothing on stderr."""
    from concurrent.futures import ThreadPoolExecutor

    from storage.lake import Lake

    bench, lake_uri, _ = played
    problem = Lake.open(lake_uri).read("proposals").filter(pl.col("verdict") == "valid")["problem_id"][0]
    commands = [
        ("sql", "select count(*) from rollouts", "--lake", lake_uri),
        ("sql", "select verdict, count(*) from proposals group by verdict", "--lake", lake_uri),
        ("lineage", "problem", problem, "--lake", lake_uri),
        ("lineage", "model-version", "1", "--lake", lake_uri),
        ("bank", "stats", "--lake", lake_uri),
    ]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda args: (args, bench.rlvr(*args)), commands * 5))
    failed = [
        (args[:2], result.returncode, result.stderr[-500:])
        for args, result in results
        if result.returncode != 0 or result.stderr.strip()
    ]
    assert not failed, failed
