"""Selection by the difficulty ledger: each problem's label from its groups, the tiers a round draws in order,
revisits of set-aside problems, and the labels on a real loop's rollouts."""

import polars as pl
import pytest

from tasks.curation.mix import sample_mix
from tasks.iteration import IterationConfig
from tasks.rollout.stage import training_bank
from tasks.sampling.guided import beta_prior
from tasks.sampling.rounds import DynamicSamplingConfig
from tasks.sampling.sampler import GroupSampler
from tasks.sampling.selection import SelectionConfig, draw_by_tier, selection_labels


def bank_of(ids: list[str]) -> pl.DataFrame:
    n = len(ids)
    return pl.DataFrame(
        {
            "problem_id": ids,
            "domain": ["math"] * n,
            "prompt": [f"q {i}" for i in ids],
            "answer": ["1"] * n,
            "level": [1] * n,
            "source": ["drill"] * n,
            **{field: [None] * n for field in ("tests", "entry_point", "verifier", "steps", "metadata", "params")},
        }
    )


# The policy's recent spread of difficulty (the prior's groups, 40 of them), and five problems with their own
# past groups at iterations 8 and 9 (evidence at iteration 10).
BACKGROUND = pl.DataFrame(
    {
        "problem_id": [f"b{i}" for i in range(40)],
        "iteration": [9] * 40,
        "solve_rate": [0.0, 0.25, 0.5, 0.75, 1.0] * 8,
        "n_samples": [8] * 40,
    }
)
OWN = pl.DataFrame(
    {
        "problem_id": ["solved", "solved", "failed", "failed", "middle", "easy", "once-solved"],
        "iteration": [8, 9, 8, 9, 9, 9, 9],
        "solve_rate": [1.0, 1.0, 0.0, 0.0, 0.375, 0.875, 1.0],
        "n_samples": [8] * 7,
    }
)
LEDGER = pl.concat([BACKGROUND, OWN])
BANK = bank_of(["solved", "failed", "middle", "easy", "once-solved", "new", *BACKGROUND["problem_id"]])


def labels_at(config: SelectionConfig, iteration: int = 10, ledger: pl.DataFrame = LEDGER) -> dict[str, str]:
    labels = selection_labels(BANK, ledger, iteration, 8, config, seed=0)
    return dict(zip(labels["problem_id"], labels["drawn_as"]))


def test_each_problem_is_labelled_by_its_own_groups_and_the_fitted_prior():
    config = SelectionConfig(revisit_rate=0.0, min_trials=16)
    labels = labels_at(config)
    assert labels["solved"] == "retired"  # 16 of 16 responses right: pass rate 1 ≥ 0.9
    assert labels["failed"] == "predicted_uniform"  # 0 of 16: the next group all wrong, P ≥ 0.75
    assert labels["middle"] == "zone" and labels["easy"] == "outside_zone"
    assert labels["new"] == "unseen"
    assert labels["once-solved"] != "retired"  # 8 trials < min_trials: not yet
    # the posterior by hand: the prior fitted to the latest groups, plus the problem's discounted evidence
    alpha, beta = beta_prior(LEDGER["solve_rate"].to_list(), 8)  # iterations 8 and 9: the latest two
    frame = selection_labels(BANK, LEDGER, 10, 8, config, seed=0)
    middle = frame.filter(pl.col("problem_id") == "middle")["posterior_solve_rate"].item()
    assert middle == pytest.approx((alpha + 0.9 * 3) / (alpha + beta + 0.9 * 8))
    assert frame.filter(pl.col("problem_id") == "new")["posterior_solve_rate"].item() is None


def test_age_leaves_a_retired_problem_retired_until_a_new_group_says_otherwise():
    config = SelectionConfig(revisit_rate=0.0, min_trials=16)
    assert labels_at(config, iteration=40)["solved"] == "retired"  # 30 iterations later: the same pass rate
    forgot = pl.concat(
        [LEDGER, pl.DataFrame({"problem_id": ["solved"], "iteration": [10], "solve_rate": [0.25], "n_samples": [8]})]
    )
    assert labels_at(config, iteration=11, ledger=forgot)["solved"] != "retired"
    # only the ledger before the iteration counts: the iteration's own groups are not evidence for its draw
    assert labels_at(config, iteration=10, ledger=forgot)["solved"] == "retired"


def test_revisits_take_back_a_seeded_share_of_the_set_aside_problems():
    every = labels_at(SelectionConfig(revisit_rate=1.0, min_trials=16))
    assert every["solved"] == every["failed"] == "revisit" and every["middle"] == "zone"
    ids = [f"s{i}" for i in range(400)]
    ledger = pl.DataFrame(
        {"problem_id": ids * 2, "iteration": [3] * 400 + [4] * 400, "solve_rate": [1.0] * 800, "n_samples": [8] * 800}
    )
    config = SelectionConfig(revisit_rate=0.1)
    labels = selection_labels(bank_of(ids), ledger, 5, 8, config, seed=7)
    share = (labels["drawn_as"] == "revisit").mean()
    assert 0.06 < share < 0.14 and set(labels["drawn_as"]) == {"retired", "revisit"}
    again = selection_labels(bank_of(ids), ledger, 5, 8, config, seed=7)
    later = selection_labels(bank_of(ids), ledger, 6, 8, config, seed=7)
    assert again.equals(labels) and not later.equals(labels)  # seeded per iteration: the same draw, a new one next


def test_a_round_draws_tier_by_tier_and_set_aside_problems_only_when_the_rest_run_out():
    config = SelectionConfig(revisit_rate=0.0, min_trials=16)
    labels = selection_labels(BANK, LEDGER, 10, 8, config, seed=0)
    tier = dict(zip(labels["problem_id"], labels["tier"]))
    first = draw_by_tier(BANK, labels, 40, 3, {1: 1.0}, None)
    tiers = [tier[p] for p in first["problem_id"]]
    assert tiers == sorted(tiers) and set(tiers) == {0, 1}  # every tier-0 problem, then tier 1, none set aside
    everything = draw_by_tier(BANK, labels, BANK.height, 3, {1: 1.0}, None)
    assert set(everything["problem_id"]) == set(BANK["problem_id"])  # a bank never runs dry
    assert {"solved", "failed"} == set(everything.tail(2)["problem_id"])
    # unlabelled, or nothing seen yet: exactly the mix's own draw for the seed
    plain = sample_mix(BANK, 10, 3, {1: 1.0}, None)
    assert draw_by_tier(BANK, None, 10, 3, {1: 1.0}, None).equals(plain)
    with pytest.raises(ValueError, match="level weights"):  # a mix the bank cannot meet fails as the mix does
        draw_by_tier(BANK, None, 10, 3, {2: 1.0}, None)
    unseen = selection_labels(BANK, LEDGER.clear(), 10, 8, config, seed=0)
    assert set(unseen["drawn_as"]) == {"unseen"} and draw_by_tier(BANK, unseen, 10, 3, {1: 1.0}, None).equals(plain)


def test_the_sampler_draws_by_the_labels_and_puts_them_on_its_rollouts():
    sampling = DynamicSamplingConfig(groups_per_batch=4, oversample=1.0)
    labels = selection_labels(BANK, LEDGER, 10, 8, SelectionConfig(revisit_rate=0.0, min_trials=16), seed=0)

    def sample(problems, round_, seed):
        return problems.select(
            "problem_id", rollout_id=pl.col("problem_id") + "-r", group_id=pl.col("problem_id") + "-g"
        ).with_columns(iteration=pl.lit(10), response=pl.lit("1"), n_tokens=pl.lit(1), self_certainty=None)

    def score(rows):
        return rows.select("rollout_id", verifier=pl.lit("exact"), reward=pl.lit(1.0), correct=pl.lit(True))

    config = IterationConfig()
    sampler = GroupSampler(sample, score, BANK, sampling, config.rollout.mix, 8, 0, 10, "exact", labels=labels)
    sampler.draw(BANK.height, 1)
    rows = sampler.rollouts[0]
    drawn = dict(zip(rows["problem_id"], rows["drawn_as"]))
    assert drawn == dict(zip(labels["problem_id"], labels["drawn_as"]))  # the whole bank, each labelled
    order = rows["drawn_as"].to_list()
    assert order.index("retired") > max(i for i, label in enumerate(order) if label in ("zone", "unseen"))
    assert rows.height == BANK.height


def test_a_loop_with_selection_labels_its_rollouts_and_sets_aside_what_it_solved(prefect_api, tmp_path):
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    selecting = {**CONFIG, "dynamic_sampling": {**CONFIG["dynamic_sampling"], "selection": {"enabled": True}}}
    for _ in range(3):
        rl_iteration(selecting, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts", columns=["iteration", "problem_id", "drawn_as"])
    first = rollouts.filter(pl.col("iteration") == 1)
    assert set(first["drawn_as"]) == {"unseen"}  # nothing in the ledger before the first iteration
    groups = lake.read("groups", columns=["iteration", "problem_id", "solve_rate", "n_samples"])
    later = rollouts.filter(pl.col("iteration") == 3).unique("problem_id")
    config = IterationConfig.model_validate(selecting)
    bank = training_bank(lake, config.rollout.mix)
    expected = selection_labels(
        bank, groups, 3, config.rollout.group_size, config.dynamic_sampling.selection, config.rollout.seed
    )
    label = dict(zip(expected["problem_id"], expected["drawn_as"]))
    assert all(label[p] == drawn for p, drawn in later.select("problem_id", "drawn_as").rows())
    tier = dict(zip(expected["problem_id"], expected["tier"]))
    undrawn = set(label) - set(later["problem_id"])
    assert {label[p] for p in undrawn} - {"unseen"}  # by iteration 3 the small bank has a record
    assert max(tier[p] for p in later["problem_id"]) <= min(tier[p] for p in undrawn)  # first tiers first
    from bench.peer_lake import selected  # the peer benchmark's account of the same run

    account = selected(lake, config, 3)
    assert account["bank_problems"] == bank.height
    assert account["distinct_problems_drawn"] == rollouts.filter(pl.col("iteration") > 0)["problem_id"].n_unique()
    final = selection_labels(bank, groups, 4, 4, config.dynamic_sampling.selection, config.rollout.seed)
    assert account["retired_at_end"] == (final["drawn_as"] == "retired").sum()


def test_a_bank_size_trains_on_a_fixed_subset_and_the_warm_up_on_every_solution(tmp_path):
    """`rollout.mix.bank_size`: RL draws the same seeded subset every iteration (a bank revisited for epochs);
    the warm-up's worked solutions stay the whole bank's, so the subset is not memorised before RL."""
    from helpers import curated

    from flows.warmup import warmup_bank
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    lake = Lake.open(lake_uri)
    mix = IterationConfig.model_validate({"rollout": {"mix": {"bank_size": 12}}}).rollout.mix
    whole = training_bank(lake, mix.model_copy(update={"bank_size": None}))
    subset = training_bank(lake, mix)
    assert subset.height == 12 and set(subset["problem_id"]) < set(whole["problem_id"])
    assert training_bank(lake, mix).equals(subset)  # the same subset at every draw
    assert set(training_bank(lake, mix.model_copy(update={"seed": 1}))["problem_id"]) != set(subset["problem_id"])
    assert training_bank(lake, mix.model_copy(update={"bank_size": 10_000})).height == whole.height
    assert set(warmup_bank(lake, mix)["problem_id"]) == set(whole["problem_id"])
