"""The sampler-trainer gap kept for every trained rollout, and the corrections replayed on it offline: the same
shares as the step measured, in the lake beside the rollouts and versions, and through `rlvr analyze mismatch`."""

import copy
import json

import polars as pl
import pytest
import torch
from test_training import policy, synthetic_rows  # noqa: F401  (the fixture)

from policy.logprobs import response_logprobs
from trainers.grpo import TrainConfig, train_on_batch
from trainers.mismatch import what_each_mode_keeps


def engine_rows(model, tokenizer) -> pl.DataFrame:
    """On-policy rows whose behaviour log-probs an engine got slightly wrong: noise of 0.1 nat a token."""
    rows = synthetic_rows(model, tokenizer, n=16, seed=3)
    generator = torch.Generator().manual_seed(5)
    noisy = [[v + float(torch.randn(1, generator=generator)) * 0.1 for v in row] for row in rows["behaviour_logprobs"]]
    return rows.with_columns(
        behaviour_logprobs=pl.Series(noisy, dtype=pl.List(pl.Float64)),
        rollout_id=pl.Series([f"r{i:02d}" for i in range(rows.height)]),
    )


@pytest.mark.parametrize("mode", ["token_mask", "sequence_mask", "geometric", "icepop"])
def test_stored_rows_replay_the_shares_the_step_masked(policy, mode):  # noqa: F811
    model, tokenizer = policy
    rows = engine_rows(model, tokenizer)
    bounds = {"geometric": (None, 1.02), "icepop": (0.9, 1.1)}.get(mode, (0.9, 1.1))
    config = TrainConfig(micro_batch_size=5, rollout_correction={"mode": mode, "low": bounds[0], "high": bounds[1]})
    metrics, _ = train_on_batch(copy.deepcopy(model), rows, config)
    stored = pl.DataFrame(metrics["mismatch_rows"])
    assert sorted(stored["rollout_id"]) == sorted(rows["rollout_id"])
    replayed = (
        what_each_mode_keeps(stored["log_ratio"], {mode: bounds}).filter(pl.col("mode") == mode).row(0, named=True)
    )
    assert 0 < metrics["correction_masked_share"] < 1  # the bounds bite, and not everywhere
    assert replayed["tokens_masked_share"] == pytest.approx(metrics["correction_masked_share"], abs=1e-12)


def test_a_rows_log_ratio_is_the_trainers_forward_minus_the_samplers(policy):  # noqa: F811
    model, tokenizer = policy
    rows = engine_rows(model, tokenizer)
    metrics, _ = train_on_batch(copy.deepcopy(model), rows, TrainConfig(micro_batch_size=5))
    stored = {row["rollout_id"]: row for row in metrics["mismatch_rows"]}
    with torch.no_grad():
        trainer, mask, _ = response_logprobs(
            model, rows["prompt_token_ids"].to_list(), rows["response_token_ids"].to_list()
        )
    for i, (rollout_id, behaviour) in enumerate(zip(rows["rollout_id"], rows["behaviour_logprobs"])):
        expected = [t - b for t, b in zip(trainer[i][: len(behaviour)].tolist(), behaviour)]
        row = stored[rollout_id]
        assert row["log_ratio"] == pytest.approx(expected, abs=1e-5) and row["after_updates"] == 0
        assert row["sequence_log_ratio"] == pytest.approx(sum(expected), abs=1e-4)
        assert row["kl_k3"] >= 0 and row["max_abs_delta"] >= row["mean_abs_delta"]
    assert metrics["mismatch_mean_abs_delta"] == pytest.approx(0.08, abs=0.03)  # |N(0, 0.1)| has mean 0.08


def test_without_recording_the_step_trains_the_same_and_keeps_no_gap(policy):  # noqa: F811
    model, tokenizer = policy
    rows = engine_rows(model, tokenizer)
    kept = copy.deepcopy(model)
    recorded, _ = train_on_batch(kept, rows, TrainConfig(micro_batch_size=5))
    bare = copy.deepcopy(model)
    skipped, _ = train_on_batch(bare, rows, TrainConfig(micro_batch_size=5, record_mismatch=False))
    assert len(recorded["mismatch_rows"]) == rows.height and skipped["mismatch_rows"] == []
    assert skipped["mismatch_mean_abs_delta"] is None and skipped["loss"] == recorded["loss"]
    assert all(torch.equal(a, b) for a, b in zip(kept.parameters(), bare.parameters()))


def test_the_training_stage_keeps_the_gap_beside_the_rollouts_and_the_command_replays_it(prefect_api, cli, tmp_path):
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration, train_policy
    from storage.catalog import open_catalog
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    train_policy(1, {"micro_batch_size": 4, "rollout_correction": {"mode": "token_tis"}}, lake_uri)
    joined = (
        open_catalog(Lake.open(lake_uri))
        .sql("""
        select x.rollout_id, x.n_tokens, r.n_tokens as response_tokens, x.model_version, r.model_version as sampled_by,
               m.parent_version, x.correction, x.max_abs_delta
        from mismatch x join rollouts r using (rollout_id) join model_versions m on m.model_version = x.trained_version
    """)
        .pl()
    )
    assert joined.height == 12 and (joined["n_tokens"] == joined["response_tokens"]).all()
    assert set(joined["model_version"]) == set(joined["sampled_by"]) == set(joined["parent_version"]) == {0}
    assert set(joined["correction"]) == {"token_tis"}
    assert joined["max_abs_delta"].max() < 1e-3  # the hf sampler's log-probs are the trainer's own
    shown = cli("analyze", "mismatch", "--iteration", "1", "--high", "1.5", "--format", "json", "--lake", lake_uri)
    assert shown.returncode == 0, shown.stderr
    modes = [json.loads(line) for line in shown.stdout.splitlines() if '"mode"' in line]
    assert [m["mode"] for m in modes][:2] == ["token_tis", "sequence_tis"] and modes[0]["high"] == 1.5
    assert all(m["tokens_masked_share"] == 0.0 for m in modes)  # no gap: nothing masked
    missing = cli("analyze", "mismatch", "--iteration", "7", "--lake", lake_uri)
    assert missing.returncode == 1 and "no mismatch rows for iteration 7" in missing.stderr


def test_the_replay_in_length_sorted_chunks_equals_one_padded_pass(monkeypatch):
    import trainers.mismatch as mismatch
    from trainers.correction import RolloutCorrection, correction_weights

    generator = torch.Generator().manual_seed(0)
    lengths = [0, 3, 70, 1, 12, 5, 40, 2, 9, 33]
    log_ratios = pl.Series([(torch.randn(n, generator=generator) * 0.3).tolist() for n in lengths])
    monkeypatch.setattr(mismatch, "CHUNK_TOKENS", 64)  # several chunks, one row longer than a chunk
    chunked = what_each_mode_keeps(log_ratios, {"icepop": (0.8, 1.25)})
    delta = torch.zeros(len(lengths), max(lengths))  # float32, as the step and the replay compute
    mask = torch.zeros_like(delta)
    for i, row in enumerate(log_ratios.to_list()):
        delta[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1.0
    for mode in ("token_mask", "sequence_mask", "icepop"):
        bounds = (0.8, 1.25) if mode == "icepop" else (None, None)
        weights = correction_weights(
            delta, torch.zeros_like(delta), mask, RolloutCorrection(mode=mode, low=bounds[0], high=bounds[1])
        )
        row = chunked.filter(pl.col("mode") == mode).row(0, named=True)
        masked = (weights == 0) & (mask > 0)
        assert row["tokens_masked_share"] == pytest.approx(int(masked.sum()) / int(mask.sum()), abs=1e-12)
        assert row["sequences_masked_share"] == pytest.approx(int(masked.any(-1).sum()) / 9, abs=1e-12)
        assert row["mean_weight"] == pytest.approx(float(weights.double().sum() / mask.sum()), rel=1e-6)  # float32 sums


def test_chunks_hold_their_padded_size_and_cover_every_row():
    from trainers.mismatch import chunks_by_padded_size

    lengths = sorted([1, 1, 2, 3, 5, 8, 13, 21, 34, 200])
    chunks = chunks_by_padded_size(lengths, 40)
    assert [i for chunk in chunks for i in range(len(lengths))[chunk]] == list(range(len(lengths)))
    for chunk in chunks:
        size = (chunk.stop - chunk.start) * lengths[chunk.stop - 1]
        assert size <= 40 or chunk.stop - chunk.start == 1
    assert chunks[-1] == slice(9, 10)  # 200 alone
