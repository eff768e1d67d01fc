"""The GPU check's model and its measurements (`check.py` runs them as parts): the shapes, the model built
from one, sampling with transformers' `generate` and with the project's sampler, the behaviour log-prob gap,
and the training steps and gradient a data-parallel run is compared with. Torch and the checkout's
torch-only modules only: a GPU host has nothing else of the project."""

from __future__ import annotations

import os
import time

import torch

SHAPES = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
    # tiny's width with head size 32, the least vLLM's CPU build serves: the vllm_server part on a CPU host
    "small": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    },
}


def use_threads() -> None:
    if os.environ.get("RLVR_TORCH_THREADS"):
        torch.set_num_threads(int(os.environ["RLVR_TORCH_THREADS"]))


def build(shape: str, device: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).to(device).eval()


def prompts_of(count: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (count, length), generator=generator)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def sample_with_generate(model, prompts: torch.Tensor, new_tokens: int) -> dict:
    """generate with scores: sampled tokens and their behaviour log-probs (temperature 1, no top-k / top-p, no
    end token, so every row does the same work and no logits processor changes the scores)."""
    device = model.device
    ids = prompts.to(device)
    sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
        )
    sync(device)
    seconds = time.perf_counter() - started
    tokens = out.sequences[:, ids.shape[1] :]  # [B, T]
    scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [B, T, V]
    behaviour = scores.gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]
    return {"tokens": tokens.cpu(), "behaviour": behaviour.cpu(), "tokens_per_s": tokens.numel() / seconds}


class Ids:
    """A tokenizer over token ids for the project's sampler: the prompts are ids already."""

    eos_token_id, pad_token_id = 2, 0

    def __call__(self, text: str, **_):
        return type("Encoded", (), {"input_ids": [int(t) for t in text.split()]})()

    def decode(self, ids, **_):
        return " ".join(map(str, ids))

    def batch_decode(self, rows, **_):
        return [self.decode(row) for row in rows]

    def get_vocab(self):
        return {}

    def convert_tokens_to_ids(self, token):
        return None


def sample_with_project(model, prompts: torch.Tensor, new_tokens: int) -> dict:
    """The project's hf sampler on the model and batch: tokens/s, the sampled token ids and their behaviour
    log-probs."""
    from policy.hf import HFPolicy
    from policy.sampling import SamplerConfig

    texts = [" ".join(map(str, row.tolist())) for row in prompts]
    policy = HFPolicy(model, Ids(), 0, batch_size=len(texts))
    sampler = SamplerConfig(max_new_tokens=new_tokens)
    sync(model.device)
    started = time.perf_counter()
    groups = policy.generate(texts, 1, sampler, seed=0, model_version=0)
    sync(model.device)
    seconds = time.perf_counter() - started
    samples = [group[0] for group in groups]
    return {
        "tokens_per_s": sum(len(sample.token_ids) for sample in samples) / seconds,
        "tokens": [sample.token_ids for sample in samples],
        "behaviour": [sample.logprobs for sample in samples],
    }


def behaviour_gap(model, prompts: torch.Tensor, tokens: list[list[int]], behaviour) -> float:
    """The largest gap between sampled tokens' behaviour log-probs and the trainer's recomputation
    (`policy/logprobs.py`) over the real tokens: a sampler that lost its KV cache shows here."""
    from policy.logprobs import response_logprobs

    with torch.no_grad():
        again, mask, _ = response_logprobs(model, prompts.tolist(), tokens)
    width = again.shape[1]
    sampled = torch.tensor([list(row) + [0.0] * (width - len(row)) for row in behaviour])
    return float(((again.cpu() - sampled).abs() * mask.cpu()).max())


def loss_of(model, prompts, tokens, behaviour, advantages, token_normaliser, dtype):
    from policy.logprobs import response_logprobs
    from trainers.loss import policy_loss

    autocast = torch.autocast(device_type=model.device.type, dtype=dtype, enabled=dtype != torch.float32)
    with autocast:
        logprobs, mask, _ = response_logprobs(model, prompts.tolist(), tokens.tolist())
    return policy_loss(
        logprobs,
        behaviour.to(logprobs.device),
        advantages.to(logprobs.device),
        mask,
        loss_type="dapo",
        token_normaliser=token_normaliser,
    ).loss


def train_steps(model, prompts, tokens, behaviour, steps: int, dtype) -> dict:
    """One untimed warm-up step, then `steps` timed optimizer steps of the trainer's loss on the sampled
    batch: tokens/s."""
    model.train()
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        advantages = torch.linspace(-1, 1, tokens.shape[0])

        def step():
            optimizer.zero_grad()
            loss = loss_of(model, prompts, tokens, behaviour, advantages, None, dtype)
            loss.backward()
            optimizer.step()
            return loss

        step()  # warm-up: kernels, the optimizer's state, the allocator
        sync(model.device)
        started = time.perf_counter()
        for _ in range(steps):
            loss = step()
        sync(model.device)
        seconds = time.perf_counter() - started
    finally:
        model.zero_grad(set_to_none=True)  # the gradients' memory back for the parts after
        model.eval()
    return {"tokens_per_s": steps * tokens.numel() / seconds, "loss": float(loss.detach())}


def gradient(model, prompts, tokens, behaviour, advantages, normaliser, dtype) -> torch.Tensor:
    model.zero_grad()
    loss_of(model, prompts, tokens, behaviour, advantages, normaliser, dtype).backward()
    return torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
