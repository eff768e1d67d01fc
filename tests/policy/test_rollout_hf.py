"""The hf backend and the sampling maths: behaviour log-probs of the distribution actually sampled,
self-certainty, finish reasons, stop strings, seeds; the tiny model and tokenizer built locally."""

import math

import pytest
import torch

from policy import logprobs as shared_logprobs
from policy.hf import HFPolicy, _cut, sequence_logprobs, stop_token_ids
from policy.sampling import SamplerConfig, sampling_logprobs, self_certainty
from policy.tiny import TinyModelConfig, build_model, train_tokenizer
from tasks.rollout.base_policy import tokenizer_corpus


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(tokenizer_corpus(count=100))


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2), tokenizer)


@pytest.fixture
def uniform_model(tokenizer):
    """A model whose every next-token distribution is uniform: its final norm outputs zeros."""
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2), tokenizer)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    return model


def test_tokenizer_is_byte_level_and_lossless(tokenizer):
    text = "Compute 3·4 + √2, then x² = 1/2. 🙂"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert len(tokenizer) == 256 + 4  # bytes plus pad, eos and the two chat markers
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_model_is_seeded_and_about_the_configured_size(tokenizer):
    first, second = (build_model(TinyModelConfig(seed=3), tokenizer) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert 0.9e6 < sum(p.numel() for p in first.parameters()) < 1.2e6


def test_sampling_logprobs_by_hand():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    plain = sampling_logprobs(logits, SamplerConfig(temperature=2.0))
    assert torch.allclose(plain, torch.log_softmax(torch.tensor([[1.5, 1.0, 0.5, 0.0]]), -1))
    top2 = sampling_logprobs(logits, SamplerConfig(top_k=2))
    expected = torch.log_softmax(torch.tensor([3.0, 2.0]), -1)
    assert torch.allclose(top2[0, :2], expected) and torch.isinf(top2[0, 2:]).all()
    probabilities = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    assert torch.allclose(
        sampling_logprobs(probabilities, SamplerConfig(top_p=0.8)).exp(), torch.tensor([[2 / 3, 1 / 3, 0.0]])
    )  # smallest set reaching 0.8: {0.6, 0.3}
    assert torch.allclose(
        sampling_logprobs(probabilities, SamplerConfig(top_p=0.5)).exp(), torch.tensor([[1.0, 0.0, 0.0]])
    )
    exact = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))  # 0.5 + 0.3 reaches 0.8 exactly, as in HF
    assert torch.allclose(sampling_logprobs(exact, SamplerConfig(top_p=0.8)).exp(), torch.tensor([[0.625, 0.375, 0.0]]))


def test_self_certainty_by_hand():
    probabilities = torch.tensor([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    expected = (1 / 3) * (math.log((1 / 3) / 0.5) + 2 * math.log((1 / 3) / 0.25))  # KL(U || p)
    result = self_certainty(probabilities.log())
    assert result[0].item() == pytest.approx(expected) and result[1].item() == pytest.approx(0.0, abs=1e-6)


def test_behaviour_logprobs_are_the_full_distribution_the_trainer_recomputes(model, tokenizer):
    policy = HFPolicy(model, tokenizer, model_version=0, batch_size=5)
    groups = policy.generate(
        ["What is 2+3?\nAnswer:", "7*8 ="], 4, SamplerConfig(max_new_tokens=12), seed=1, model_version=0
    )
    samples = [s for group in groups for s in group]
    recomputed = sequence_logprobs(model, [s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
    for sample, logprobs in zip(samples, recomputed):
        assert torch.allclose(torch.tensor(sample.logprobs), logprobs.detach(), atol=1e-4)


def test_finished_rows_leave_the_models_batch_and_the_rest_keep_their_context(model, tokenizer):
    """Rows that ended are dropped from the forward (their KV cache rows too) once they are an eighth of the
    batch; every other row's log-probs still match a fresh forward over its own prompt and tokens, so each kept
    its own cache rows. Stop strings end rows between end tokens, so both ways of finishing narrow it."""
    widths = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        policy = HFPolicy(model, tokenizer, model_version=0, batch_size=64)
        groups = policy.generate(
            ["What is 2+3?\nAnswer:", "7*8 ="],
            32,
            SamplerConfig(max_new_tokens=40, stop=["7"]),
            seed=3,
            model_version=0,
        )
    finally:
        hook.remove()
    samples = [s for group in groups for s in group]
    assert widths[0] == 2  # each prompt prefilled once, its KV cache copied to its 32 rows
    assert widths[1] == 64 and min(widths) < 56 and widths[1:] == sorted(widths[1:], reverse=True)  # it narrowed
    assert {s.finish_reason for s in samples} == {"stop", "length"}
    recomputed = sequence_logprobs(model, [s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
    for sample, logprobs in zip(samples, recomputed):
        assert torch.allclose(torch.tensor(sample.logprobs), logprobs.detach(), atol=1e-4)
        assert (
            sample.finish_reason == "length"
            or sample.token_ids[-1] in stop_token_ids(model, tokenizer)
            or "7" in tokenizer.decode(sample.token_ids)
        )


def test_a_groups_shared_prefill_samples_what_a_prefill_per_row_samples(model, tokenizer, monkeypatch):
    """Rows that repeat a prompt share its prefill (one forward per distinct prompt, the KV cache spread over the
    rows): with the same seed, the tokens and log-probs are those of prefilling every row, prompts of different
    lengths (left padding) included."""
    prompts = ["What is 2+3?\nAnswer:", "7*8 =", "A longer prompt than the others, 12*12 ="]
    policy = HFPolicy(model, tokenizer, model_version=0, batch_size=64)
    sampler = SamplerConfig(max_new_tokens=24)
    assert shared_logprobs.shared_prefill([[5, 6], [7], [5, 6], [7]], "cpu")[1].tolist() == [0, 1, 0, 1]
    assert shared_logprobs.shared_prefill([[5, 6], [7]], "cpu")[1] is None
    shared = policy.generate(prompts, 8, sampler, seed=11, model_version=0)
    monkeypatch.setattr(shared_logprobs, "shared_prefill", lambda ids, device: (torch.arange(len(ids)), None))
    per_row = policy.generate(prompts, 8, sampler, seed=11, model_version=0)
    for group, alone in zip(shared, per_row):
        assert [s.token_ids for s in group] == [s.token_ids for s in alone]
        for sample, other in zip(group, alone):
            assert sample.logprobs == pytest.approx(other.logprobs, abs=1e-5)


def test_top_k_logprobs_describe_the_truncated_distribution(model, tokenizer):
    policy = HFPolicy(model, tokenizer, model_version=0)
    samples = policy.generate(["7*8 ="], 6, SamplerConfig(top_k=5, max_new_tokens=8), seed=2, model_version=0)[0]
    recomputed = sequence_logprobs(model, [s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
    for sample, full in zip(samples, recomputed):
        assert (torch.tensor(sample.logprobs) > full.detach() + 1e-3).all()  # renormalised over 5 tokens


def test_uniform_policy_stops_at_eos_or_length_with_exact_logprobs(uniform_model, tokenizer):
    policy = HFPolicy(uniform_model, tokenizer, model_version=0, batch_size=64)
    samples = policy.generate(["x"], 128, SamplerConfig(max_new_tokens=40), seed=0, model_version=0)[0]
    vocabulary = len(tokenizer)
    reasons = {s.finish_reason for s in samples}
    assert reasons == {"stop", "length"}  # P(an end token within 40) = 1 − (258/260)^40 ≈ 27 %
    end_tokens = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert {s.token_ids[-1] for s in samples if s.finish_reason == "stop"} == end_tokens  # both end a response
    for sample in samples:
        assert sample.logprobs == pytest.approx([-math.log(vocabulary)] * len(sample.token_ids), abs=1e-5)
        assert sample.self_certainty == pytest.approx(0.0, abs=1e-5)  # a uniform distribution is maximally unsure
        if sample.finish_reason == "stop":
            assert sample.token_ids[-1] in end_tokens and len(sample.token_ids) <= 40
        else:
            assert len(sample.token_ids) == 40 and not end_tokens & set(sample.token_ids)


def test_stop_strings_end_responses_and_are_cut_from_the_text(uniform_model, tokenizer):
    policy = HFPolicy(uniform_model, tokenizer, model_version=0)
    stop = list("abcdefghijklmnopqrstuvwxyz")
    samples = policy.generate(["x"], 16, SamplerConfig(max_new_tokens=200, stop=stop), seed=0, model_version=0)[0]
    assert all(s.finish_reason == "stop" for s in samples)
    assert not any(letter in s.text for s in samples for letter in stop)


def test_a_multibyte_stop_string_is_found_across_its_byte_tokens(uniform_model, tokenizer):
    policy = HFPolicy(uniform_model, tokenizer, model_version=0)
    smiles = tokenizer("🙂🙂").input_ids  # two characters, eight byte tokens
    rows = torch.tensor([[7, 8, 9] + smiles, [7, 8, 9] + smiles, [7, 8, 9] + smiles[:7] + [0]])
    lengths, alive = torch.tensor([11, 10, 11]), torch.tensor([True, True, True])
    assert len(smiles) == 8  # the whole string; one byte short; its last byte replaced
    assert policy._hit_stop_string(rows, lengths, alive, ["🙂🙂"]).tolist() == [True, False, False]
    assert policy._hit_stop_string(rows, lengths, torch.tensor([False, True, True]), ["🙂🙂"]).tolist() == [False] * 3
    assert _cut(tokenizer.decode([7, 8] + smiles + [9], skip_special_tokens=True), ["🙂🙂"]) == tokenizer.decode([7, 8])


def test_seeded_generation_is_reproducible(model, tokenizer):
    policy = HFPolicy(model, tokenizer, model_version=0)
    sampler = SamplerConfig(max_new_tokens=10)
    first, again, other = (policy.generate(["1+1="], 4, sampler, seed, 0)[0] for seed in (5, 5, 6))
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert [s.token_ids for s in first] != [s.token_ids for s in other]


def test_greedy_has_zero_logprobs_and_identical_samples(model, tokenizer):
    policy = HFPolicy(model, tokenizer, model_version=0)
    samples = policy.generate(["1+1="], 3, SamplerConfig(temperature=0, max_new_tokens=6), 0, 0)[0]
    assert len({tuple(s.token_ids) for s in samples}) == 1 and all(lp == 0.0 for lp in samples[0].logprobs)


def test_a_policy_refuses_another_model_version(model, tokenizer):
    with pytest.raises(ValueError, match="holds model version 0, not 2"):
        HFPolicy(model, tokenizer, model_version=0).generate(["x"], 1, SamplerConfig(), 0, model_version=2)


def test_the_sampling_benchmark_times_both_samplers_on_the_same_work():
    """`rlvr bench sampling`: our sampler and transformers' generate sample the same rows to the same cap on one
    model (random weights: nearly every row runs to the cap), so tokens per second compare like for like."""
    from bench.sampling import build, compare, generate_tokens_per_second, hf_tokens_per_second

    model, tokenizer = build("tiny")
    prompts = ["1 * 2 + 3 =", "4 * 5 + 6 ="]
    ours, _ = hf_tokens_per_second(model, tokenizer, prompts, 3, 12)
    theirs, _ = generate_tokens_per_second(model, tokenizer, prompts, 3, 12)
    assert 0 < ours <= 6 * 12 and 0 < theirs <= 6 * 12  # 6 rows, at most 12 new tokens each
    result = compare("tiny", 2, 2, 8, 1)
    assert result["rows"] == 4 and result["ratio"] == pytest.approx(
        result["hf_tokens_per_s"] / result["generate_tokens_per_s"], rel=1e-2
    )
