"""The embedded default policy: a tiny Qwen2-style model and a byte-level tokenizer, both made here.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on text the project generates
(with `merges: 0` it is a plain byte tokenizer, which is what a 1M-parameter model learns best);
the model is built from a config with seeded random weights. A chat template in the ChatML style
is attached so that `template: chat` prompts work with the same code as a real instruct model.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from policy.checkpoints import MODEL_BUILDING
from storage.config import Strict

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyModelConfig(Strict):
    """Shape of the embedded default policy (a Qwen2 decoder); about 1M parameters by default."""

    hidden_size: int = Field(128, ge=8, description="width of the residual stream")
    intermediate_size: int = Field(512, ge=8, description="width of the MLP")
    num_hidden_layers: int = Field(4, ge=1, description="decoder layers")
    num_attention_heads: int = Field(4, ge=1, description="query heads; must divide hidden_size")
    num_key_value_heads: int = Field(2, ge=1, description="key/value heads (grouped-query attention)")
    max_position_embeddings: int = Field(1024, ge=16, description="longest prompt plus response, in tokens")
    merges: int = Field(0, ge=0, description="BPE merges learned over the local corpus; 0 = byte-level tokenizer")
    seed: int = Field(0, description="seed of the random initial weights")


def train_tokenizer(corpus: Iterable[str], merges: int = 0):
    """A byte-level BPE tokenizer trained on `corpus`, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, IM_START, IM_END]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + len(specials) + merges,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.padding_side = "left"  # generation appends on the right
    return wrapped


def build_model(config: TinyModelConfig, tokenizer):
    """A randomly initialised Qwen2 causal LM sized by `config`, seeded."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if config.hidden_size % config.num_attention_heads or config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            "tiny model: num_attention_heads must divide hidden_size, and num_key_value_heads "
            "must divide num_attention_heads"
        )
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with MODEL_BUILDING, torch.random.fork_rng():  # see policy/checkpoints.py
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(model_config)
    return model.eval()
