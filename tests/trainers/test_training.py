"""The GRPO / DAPO step: accumulation that adds up to the full batch, the direction of learning,
the optimizer state carried across versions, and version N+1 registered with its lineage."""

import copy
import re

import polars as pl
import pytest
import torch

from policy.logprobs import response_logprobs
from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from tasks.rollout.base_policy import tokenizer_corpus
from trainers.grpo import TrainConfig, train_on_batch

SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(tokenizer_corpus(count=50))
    return build_model(SMALL, tokenizer), tokenizer


def synthetic_rows(model, tokenizer, n=12, seed=0) -> pl.DataFrame:
    """Responses of varied length with their behaviour log-probs under `model` (on-policy) and advantages."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [tokenizer(f"{i} + {i} =").input_ids for i in range(n)]
    responses = [
        torch.randint(4, 200, (int(torch.randint(2, 9, (1,), generator=generator)),), generator=generator).tolist()
        for _ in range(n)
    ]
    with torch.no_grad():
        logprobs, mask, _ = response_logprobs(model, prompts, responses)
    return pl.DataFrame(
        {
            "prompt_token_ids": prompts,
            "response_token_ids": responses,
            "behaviour_logprobs": [row[: len(r)].tolist() for row, r in zip(logprobs, responses)],
            "advantage": torch.randn(n, generator=generator).tolist(),
            "weight": [1.0] * n,
            "temperature": [1.0] * n,
        }
    )


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "gspo", "cispo", "sapo"])
def test_micro_batches_add_up_to_the_full_batch(policy, loss_type):
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer)
    whole, split = copy.deepcopy(model), copy.deepcopy(model)
    metrics_whole, _ = train_on_batch(whole, rows, TrainConfig(loss_type=loss_type, micro_batch_size=64))
    metrics_split, _ = train_on_batch(split, rows, TrainConfig(loss_type=loss_type, micro_batch_size=5))
    assert metrics_whole["loss"] == pytest.approx(metrics_split["loss"], abs=1e-6)
    assert metrics_whole["grad_norm"] == pytest.approx(metrics_split["grad_norm"], rel=1e-4)
    for a, b in zip(whole.parameters(), split.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(whole.parameters(), model.parameters()))


def test_bnpo_normalises_by_each_micro_batchs_tokens(policy):
    """BNPO is DAPO's token mean taken per micro-batch (TRL's `bnpo`): one micro-batch, the same step as dapo;
    split, each micro-batch weighs by its share of the sequences whatever its token count."""
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer)
    runs = {
        (loss_type, size): train_on_batch(
            copy.deepcopy(model), rows, TrainConfig(loss_type=loss_type, micro_batch_size=size)
        )[0]["loss"]
        for loss_type in ("dapo", "bnpo")
        for size in (64, 5)
    }
    assert runs["bnpo", 64] == pytest.approx(runs["dapo", 64], abs=1e-6)
    assert runs["bnpo", 5] != pytest.approx(runs["dapo", 5], abs=1e-6)


def test_micro_batches_are_cut_in_length_order(policy):
    """Each forward pass pads to its longest sequence: micro-batches of similar lengths waste the least."""
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer, n=24, seed=3)
    lengths = sorted((rows["prompt_token_ids"].list.len() + rows["response_token_ids"].list.len()).to_list())
    shapes = []
    trained = copy.deepcopy(model)
    trained.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    train_on_batch(trained, rows, TrainConfig(micro_batch_size=6))
    assert [rows for rows, _ in shapes] == [6, 6, 6, 6]
    assert [width for _, width in shapes] == [max(lengths[i : i + 6]) for i in range(0, 24, 6)]  # the least padding


def test_a_step_makes_positive_advantage_responses_likelier(policy):
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer, n=8, seed=1)
    rows = rows.with_columns(advantage=pl.Series([1.0, -1.0] * 4))
    trained = copy.deepcopy(model)
    train_on_batch(trained, rows, TrainConfig(learning_rate=1e-3))
    prompts, responses = rows["prompt_token_ids"].to_list(), rows["response_token_ids"].to_list()
    with torch.no_grad():
        before = response_logprobs(model, prompts, responses)[0].sum(-1)
        after = response_logprobs(trained, prompts, responses)[0].sum(-1)
    change = (after - before).tolist()
    assert all(c > 0 for c in change[0::2]) and all(c < 0 for c in change[1::2])


def test_the_config_not_the_saved_state_sets_weight_decay(policy):
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer)
    trained = copy.deepcopy(model)
    _, state = train_on_batch(trained, rows, TrainConfig(weight_decay=0.0))
    assert state["optimizer"]["param_groups"][0]["weight_decay"] == 0.0
    _, state = train_on_batch(trained, rows, TrainConfig(weight_decay=0.1), state)
    assert state["optimizer"]["param_groups"][0]["weight_decay"] == 0.1


def test_the_optimizer_state_and_step_count_carry_over(policy):
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer)
    trained = copy.deepcopy(model)
    config = TrainConfig(warmup_steps=4, mini_batches=2)
    first, state = train_on_batch(trained, rows, config)
    second, state = train_on_batch(trained, rows, config, state)
    assert (first["global_step"], second["global_step"]) == (2, 4)
    assert first["learning_rate"] == pytest.approx(1e-4 * 2 / 4) and second["learning_rate"] == pytest.approx(1e-4)
    assert state["optimizer"]["state"]  # Adam moments travel with the checkpoint


def test_training_registers_the_next_version_with_lineage(prefect_api, tmp_path):
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration, train_policy
    from storage.catalog import open_catalog
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    result = train_policy(1, {"micro_batch_size": 4}, lake_uri)
    assert result["trained"] and result["model_version"] == 1 and result["sequences"] == 12
    lake = Lake.open(lake_uri)
    lineage = (
        open_catalog(lake)
        .sql("""
        select m.model_version, m.parent_version, b.batch_id, r.model_version as sampled_by, p.bank_version,
               rm.stage as train_stage, rb.stage as batch_stage
        from model_versions m, unnest(m.batch_ids) as t(batch_id)
        join batches b on b.batch_id = t.batch_id join rollouts r using (rollout_id) join problems p using (problem_id)
        join runs rm on rm.run_id = m.run_id join runs rb on rb.run_id = b.run_id
        where m.model_version = 1
    """)
        .pl()
    )
    assert lineage.height == 12 and set(lineage["sampled_by"]) == {0} and set(lineage["parent_version"]) == {0}
    assert set(lineage["train_stage"]) == {"train"} and set(lineage["batch_stage"]) == {"advantages"}
    assert rl_iteration(CONFIG, iteration=2, lake_uri=lake_uri)["model_version"] == 1  # sampled by the new version
    assert set(lake.read("rollouts").filter(pl.col("iteration") == 2)["model_version"]) == {1}


def test_command_line_train_and_model_version_lineage(cli, tmp_path):
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    config = tmp_path / "train.yaml"
    config.write_text("train:\n  micro_batch_size: 4\n  loss_type: grpo\n")
    trained = cli("train", "--iteration", "1", "--config", str(config), "--processes", "2", "--lake", lake_uri)
    assert trained.returncode == 0, trained.stderr
    assert "iteration 1: trained" in trained.stdout
    assert re.search(r"processes\s+│\s+2\b", trained.stdout), trained.stdout  # data parallel, from the flag
    lineage = cli("lineage", "model-version", "1", "--lake", lake_uri)
    assert lineage.returncode == 0, lineage.stderr
    assert "version 1 (rl, parent 0, iteration 1)" in lineage.stdout and "12 rollouts of 3 problems" in lineage.stdout
    assert "version 0 (base, no parent)" in lineage.stdout
    from flows.iteration import compute_advantages

    compute_advantages(1, CONFIG, lake_uri)  # the iteration's batch is replaced after training
    replaced = cli("lineage", "model-version", "1", "--lake", lake_uri)
    assert replaced.returncode == 0 and "no longer in `batches`" in replaced.stdout
    unknown = cli("lineage", "model-version", "9", "--lake", lake_uri)
    assert unknown.returncode == 1 and "model version 9 is not registered" in unknown.stderr


def test_throughput_benchmark_runs_both_sides():
    from bench.train_throughput import run_benchmark

    result = run_benchmark(sequences=8, group=4, prompt_length=4, response_length=6, repeats=1)
    assert result["tokens_per_step"] == 48
    assert result["ours_tokens_per_second"] > 0 and result["trl_tokens_per_second"] > 0 and result["ratio"] > 0


def test_lora_versions_are_adapters_that_continue_and_load_merged(prefect_api, tmp_path):
    import os

    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration, train_policy
    from policy.checkpoints import adapter_base, load_policy
    from storage.lake import Lake
    from storage.registry import version_row

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    lora = {"micro_batch_size": 4, "learning_rate": 1e-2, "lora": {"r": 4, "alpha": 8}}
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    first = train_policy(1, lora, lake_uri)
    lake = Lake.open(lake_uri)
    base_uri, v1_uri = (version_row(lake, v)["checkpoint_uri"] for v in (0, 1))
    assert set(os.listdir(v1_uri)) >= {"adapter_config.json", "adapter_model.safetensors"}
    assert "model.safetensors" not in os.listdir(v1_uri) and adapter_base(v1_uri) == base_uri
    base, _ = load_policy(base_uri)
    merged, _ = load_policy(v1_uri)  # what the hf backend samples from
    assert any(not torch.equal(a, b) for a, b in zip(base.state_dict().values(), merged.state_dict().values()))
    rl_iteration(CONFIG, iteration=2, lake_uri=lake_uri)  # sampled by the adapter version
    second = train_policy(2, lora, lake_uri)
    v2_uri = version_row(lake, 2)["checkpoint_uri"]
    assert adapter_base(v2_uri) == base_uri and second["global_step"] == first["global_step"] + 1
    assert set(lake.read("rollouts").filter(pl.col("iteration") == 2)["model_version"]) == {1}


def test_two_data_parallel_processes_train_as_one(prefect_api, tmp_path):
    """`train.processes: 2` (gloo on CPU): each process trains half of the batch and the gradients are summed,
    so the loss, gradient norm and trained weights equal one process's on the same batch, and one checkpoint
    is written (by this process, from process 0's weights)."""
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration, train_policy
    from policy.checkpoints import load_policy
    from storage.lake import Lake
    from storage.registry import version_row

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, iteration=1, lake_uri=lake_uri)
    one = train_policy(1, {"micro_batch_size": 5}, lake_uri)
    two = train_policy(1, {"micro_batch_size": 5, "processes": 2}, lake_uri, parent=0)  # the same step, a branch
    assert (one["model_version"], two["model_version"]) == (1, 2) and two["sequences"] == one["sequences"] == 12
    assert (one["processes"], two["processes"]) == (1, 2) and two["torch_threads"] == 1  # a core each
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6) and two["tokens"] == one["tokens"]
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert two["clip_fraction"] == pytest.approx(one["clip_fraction"], abs=1e-6)
    lake = Lake.open(lake_uri)
    trained = [load_policy(version_row(lake, version)["checkpoint_uri"])[0] for version in (1, 2)]
    for a, b in zip(*(model.parameters() for model in trained)):
        assert torch.allclose(a, b, atol=1e-6)
    base = load_policy(version_row(lake, 0)["checkpoint_uri"])[0]
    assert any(not torch.equal(a, b) for a, b in zip(trained[1].parameters(), base.parameters()))
    folders = sorted(p.rsplit("/", 1)[1] for p in lake.location.filesystem.ls(lake.location.path("models")))
    assert folders == ["v00000", "v00001", "v00002"]


def test_the_decoupled_loss_weights_each_off_policy_token_from_the_same_forward_pass(policy):
    """`off_policy_loss: decoupled`: the ratio is taken to the policy at the step's start, and each token is
    weighted by min(π_start / π_behaviour, cap). On-policy rows train exactly as the behaviour loss trains them;
    rows whose behaviour log-probs lie 5 nats below the policy's get the cap (2) on every token: twice the loss."""
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer)
    behaviour, decoupled = copy.deepcopy(model), copy.deepcopy(model)
    plain, _ = train_on_batch(behaviour, rows, TrainConfig(micro_batch_size=5))
    same, _ = train_on_batch(decoupled, rows, TrainConfig(micro_batch_size=5, off_policy_loss="decoupled"))
    assert same["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    for a, b in zip(behaviour.parameters(), decoupled.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    older = rows.with_columns(behaviour_logprobs=rows["behaviour_logprobs"].list.eval(pl.element() - 5.0))
    capped, _ = train_on_batch(
        copy.deepcopy(model), older, TrainConfig(micro_batch_size=5, off_policy_loss="decoupled")
    )
    assert capped["loss"] == pytest.approx(2 * plain["loss"], rel=1e-5) and capped["clip_fraction"] == 0.0


@pytest.mark.parametrize(
    "mode, stale_factor",
    [
        ("token_tis", 3.0),
        ("sequence_tis", 3.0),
        ("token_mask", 0.0),
        ("sequence_mask", 0.0),
        ("geometric", 0.0),
        ("icepop", 0.0),
    ],
)
def test_each_rollout_correction_trains_on_policy_rows_as_none_and_weights_stale_ones_by_its_rule(
    policy, mode, stale_factor
):
    """On-policy rows (behaviour = the trainer's own log-probs): every weight is 1 and the step is the
    uncorrected one. Rows 5 nats less likely under the sampler (ratio e^5 on every token): the truncations
    weigh each token by their cap (3), the masks and rejections drop every row."""
    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer)
    plain, _ = train_on_batch(copy.deepcopy(model), rows, TrainConfig(micro_batch_size=5))
    config = TrainConfig(micro_batch_size=5, rollout_correction={"mode": mode})
    same, _ = train_on_batch(copy.deepcopy(model), rows, config)
    assert same["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    older = rows.with_columns(behaviour_logprobs=rows["behaviour_logprobs"].list.eval(pl.element() - 5.0))
    stale, _ = train_on_batch(copy.deepcopy(model), older, config)
    assert stale["loss"] == pytest.approx(stale_factor * plain["loss"], rel=1e-5, abs=1e-9)


def test_the_decoupled_clip_acts_on_later_mini_batches_against_the_policy_at_the_batch_start(policy, monkeypatch):
    """With two mini-batches the second is trained after the first's update. Its ratio is to π_prox, the policy
    before the batch's first update (AReaL), so the clip can fire; taken to the same forward pass, detached, the
    ratio is 1 on every token and the clip never acts, whatever the update did."""
    import trainers.grpo as grpo

    model, tokenizer = policy
    rows = synthetic_rows(model, tokenizer, n=16, seed=7)
    start = copy.deepcopy(model)
    calls = []
    real = grpo.micro_batch_loss

    def recorded(model, micro, *args, **kwargs):
        calls.append((micro, args[-1] if len(args) >= 8 else kwargs.get("proximal")))
        return real(model, micro, *args, **kwargs)

    monkeypatch.setattr(grpo, "micro_batch_loss", recorded)
    config = TrainConfig(micro_batch_size=16, mini_batches=2, learning_rate=0.05, off_policy_loss="decoupled")
    metrics, _ = train_on_batch(copy.deepcopy(model), rows, config)
    assert metrics["optimizer_steps"] == 2 and metrics["clip_fraction"] > 0
    (first, first_proximal), (second, second_proximal) = calls
    assert first_proximal is None  # the first update's own forward is the start policy
    with torch.no_grad():
        expected, _, _ = response_logprobs(
            start, second["prompt_token_ids"].to_list(), second["response_token_ids"].to_list()
        )
    assert torch.allclose(second_proximal, expected, atol=1e-6)
    one, _ = train_on_batch(copy.deepcopy(model), rows, config.model_copy(update={"mini_batches": 1}))
    assert one["clip_fraction"] == 0.0  # one update: every ratio is exactly 1


def test_a_decoupled_loss_with_the_sequence_weight_too_is_refused():
    from flows.run_config import RunConfig

    with pytest.raises(ValueError, match="set advantages.off_policy_weight: none"):
        RunConfig.model_validate({"train": {"off_policy_loss": "decoupled"}})
    RunConfig.model_validate({"train": {"off_policy_loss": "decoupled"}, "advantages": {"off_policy_weight": "none"}})


def grouped_rows(model, tokenizer, groups=4, group_size=6, seed=5) -> pl.DataFrame:
    """`synthetic_rows` in groups: each prompt (of different lengths) repeated for `group_size` responses of
    varied length, one of them empty."""
    rows = synthetic_rows(model, tokenizer, n=groups * group_size, seed=seed)
    prompts = [tokenizer(f"{'long ' * g}{g} * {g} =").input_ids for g in range(groups) for _ in range(group_size)]
    responses = rows["response_token_ids"].to_list()
    responses[1] = []
    with torch.no_grad():
        logprobs, _, _ = response_logprobs(model, prompts, responses)
    return rows.with_columns(
        pl.Series("prompt_token_ids", prompts),
        pl.Series("response_token_ids", responses),
        pl.Series("behaviour_logprobs", [row[: len(r)].tolist() for row, r in zip(logprobs, responses)]),
    )


def test_a_groups_prompt_forwarded_once_gives_each_rows_logprobs_and_gradients(policy):
    """`share_prompts`: one forward per distinct prompt, its KV cache spread over the group's rows, then the
    responses on top: the same log-probs, entropies and gradients as forwarding every row whole."""
    model, tokenizer = policy
    rows = grouped_rows(model, tokenizer)
    prompts, responses = rows["prompt_token_ids"].to_list(), rows["response_token_ids"].to_list()
    widths, results = [], {}
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        for shared in (False, True):
            model.zero_grad()
            logprobs, mask, entropy = response_logprobs(
                model, prompts, responses, 0.7, with_entropy=True, share_prompts=shared
            )
            (logprobs * torch.linspace(-1, 1, logprobs.shape[1])).sum().backward()
            results[shared] = (logprobs.detach(), mask, entropy, [p.grad.clone() for p in model.parameters()])
    finally:
        hook.remove()
        model.zero_grad()
    assert widths[0][0] == 24 and widths[1][0] == 4 and widths[2][0] == 24  # 4 prompts once, then 24 responses
    (whole, whole_mask, whole_entropy, whole_grads), (once, once_mask, once_entropy, once_grads) = (
        results[False],
        results[True],
    )
    assert torch.equal(whole_mask, once_mask) and whole_mask[1].sum() == 0
    assert torch.allclose(whole, once, atol=1e-5) and torch.allclose(whole_entropy, once_entropy, atol=1e-5)
    for a, b in zip(whole_grads, once_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_model_whose_cache_cannot_be_spread_forwards_rows_whole_after_one_try(policy, monkeypatch):
    """A cache without `batch_select_indices` cannot be spread over a group's rows: the first batch finds out
    after its prompt pass and forwards rows whole; later batches of that model class skip the prompt pass."""
    from transformers.cache_utils import Cache

    from policy import logprobs as logprobs_module

    model, tokenizer = policy
    rows = grouped_rows(model, tokenizer)
    prompts, responses = rows["prompt_token_ids"].to_list(), rows["response_token_ids"].to_list()
    monkeypatch.setattr(logprobs_module, "_UNSPREADABLE", set())
    monkeypatch.delattr(Cache, "batch_select_indices")
    widths = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            tried, again, whole = (
                response_logprobs(model, prompts, responses, share_prompts=shared)[0] for shared in (True, True, False)
            )
    finally:
        hook.remove()
    assert widths == [4, 24, 24, 24]  # one prompt pass wasted, once
    assert torch.equal(tried, whole) and torch.equal(again, whole)


def test_a_step_over_groups_keeps_each_group_in_one_micro_batch_and_trains_as_rows_forwarded_whole(policy, monkeypatch):
    from trainers.distributed import SingleDevice
    from trainers.grpo import micro_batch_order

    model, tokenizer = policy
    rows = grouped_rows(model, tokenizer, seed=7)
    prompts = [tuple(ids) for ids in rows["prompt_token_ids"].to_list()]
    lengths = (rows["prompt_token_ids"].list.len() + rows["response_token_ids"].list.len()).to_list()
    order = micro_batch_order(list(range(rows.height))[::-1], lengths, prompts)
    assert [prompts[i] for i in order[:6]] == [prompts[order[0]]] * 6  # a group's rows side by side
    shared, whole = copy.deepcopy(model), copy.deepcopy(model)
    config = TrainConfig(loss_type="dapo", micro_batch_size=12)
    metrics_shared, _ = train_on_batch(shared, rows, config)
    monkeypatch.setattr(SingleDevice, "shares_prompts", False)
    metrics_whole, _ = train_on_batch(whole, rows, config)
    assert metrics_shared["loss"] == pytest.approx(metrics_whole["loss"], abs=1e-6)
    for a, b in zip(shared.parameters(), whole.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
