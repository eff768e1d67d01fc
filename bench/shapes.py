"""The model shapes benchmarks run on: `tiny`, the embedded default policy, and `0.5b`, a Qwen2.5-0.5B-shaped
config (24 layers, hidden 896, vocabulary 151,936) built from scratch with random weights (nothing is
downloaded), which is where the per-token work over a large vocabulary and a real model's size show."""

from __future__ import annotations

SHAPES = {
    "tiny": {},
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    },
}


def build(shape: str, seed: int = 0):
    """(model, tokenizer) of a shape: the tiny policy's byte tokenizer (ids past it decode to nothing)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from policy.tiny import TinyModelConfig, build_model, train_tokenizer
    from tasks.rollout.base_policy import tokenizer_corpus

    tokenizer = train_tokenizer(tokenizer_corpus(count=200), 0)
    if shape == "tiny":
        return build_model(TinyModelConfig(seed=seed), tokenizer).eval(), tokenizer
    torch.manual_seed(seed)
    config = Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config).eval(), tokenizer
