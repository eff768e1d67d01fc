"""The in-process checkpoint cache: a version just saved loads from memory, exactly as it would from its
files, every load is a copy of its own, and a folder whose files changed is read again."""

import pytest
import torch

from policy import cache as policy_cache
from policy.checkpoints import load_policy, load_training_state, save_checkpoint
from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from storage.lake import Lake
from tasks.rollout.base_policy import tokenizer_corpus

SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture()
def saved(tmp_path):
    """A checkpoint saved with its optimizer state; the cache starts empty and is emptied after."""
    policy_cache.forget()
    tokenizer = train_tokenizer(tokenizer_corpus(count=50))
    model = build_model(SMALL, tokenizer)
    state = {"optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []}, "step": 7}
    uri = save_checkpoint(Lake.open(str(tmp_path / "lake")), 1, model, tokenizer, state)
    yield uri, model, state
    policy_cache.forget()


def weights(model) -> dict:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_a_saved_version_loads_from_memory_as_it_would_from_its_files(saved):
    uri, model, _ = saved
    assert policy_cache.recall("policy", uri) is not None  # kept at save time
    from_memory, _ = load_policy(uri)
    policy_cache.forget()
    from_files, _ = load_policy(uri)
    assert same(weights(from_memory), weights(from_files)) and same(weights(from_memory), weights(model))
    assert from_memory is not model


def test_every_load_is_a_copy_so_training_in_place_changes_nothing_kept(saved):
    uri, model, state = saved
    first, _ = load_policy(uri)
    with torch.no_grad():
        for parameter in first.parameters():
            parameter.add_(1.0)  # what a training step does to its model
    second, _ = load_policy(uri)
    assert same(weights(second), weights(model))
    loaded = load_training_state(uri)
    loaded["optimizer"]["state"][0]["exp_avg"].mul_(0)  # AdamW updates its state in place
    assert torch.equal(load_training_state(uri)["optimizer"]["state"][0]["exp_avg"], torch.ones(3))
    assert load_training_state(uri)["step"] == state["step"]


def test_a_read_only_load_shares_the_kept_model_and_a_training_load_still_copies_it(saved):
    """A sampler only reads its model: it gets the kept one itself, not a copy (10-40 ms a load); a trainer's
    load is still a copy of its own, so its steps never reach what the sampler or a later load holds."""
    uri, model, _ = saved
    sampled, _ = load_policy(uri, read_only=True)
    assert load_policy(uri, read_only=True)[0] is sampled and same(weights(sampled), weights(model))
    trained, _ = load_policy(uri)
    assert trained is not sampled
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(1.0)
    assert same(weights(sampled), weights(model)) and same(weights(load_policy(uri)[0]), weights(model))


def test_a_folder_whose_checkpoint_changed_is_read_again(saved):
    uri, model, _ = saved
    other, _ = load_policy(uri)  # cached now
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(0.5)
    other.save_pretrained(uri)  # the same folder, other weights
    reloaded, _ = load_policy(uri)
    assert same(weights(reloaded), weights(other)) and not same(weights(reloaded), weights(model))


def test_models_over_the_size_limit_are_not_kept(saved, monkeypatch):
    uri, model, _ = saved
    policy_cache.forget()
    monkeypatch.setattr(policy_cache, "MAX_PARAMETERS", 10)
    load_policy(uri)
    assert policy_cache.recall("policy", uri) is None


def test_models_built_in_two_threads_at_once_come_out_whole(tmp_path):
    """Loading a checkpoint while another thread builds a model: both models are tied and fully on the CPU (transformers
    swaps process-wide state while it loads; storage/checkpoints.MODEL_BUILDING keeps builds apart)."""
    import threading

    from policy.checkpoints import load_policy

    tokenizer = train_tokenizer(tokenizer_corpus(count=50))
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1), tokenizer)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    built, failures = [], []

    def work(index: int) -> None:
        try:
            for _ in range(6):
                policy_cache.forget()
                loaded = (
                    load_policy(str(tmp_path / "ckpt"))[0]
                    if index % 2
                    else build_model(
                        TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1), tokenizer
                    )
                )
                built.append(loaded)
        except Exception as error:  # noqa: BLE001  (the assertion below names it)
            failures.append(repr(error))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert all(m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr() for m in built)
    assert all(p.device.type == "cpu" for m in built for p in m.parameters())
