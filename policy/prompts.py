"""Prompt templates: how a bank problem becomes the text the policy continues."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from storage.config import Strict


class PromptConfig(Strict):
    """Plain text around the problem, or the model's chat template."""

    template: Literal["plain", "chat"] = Field(
        "plain",
        description="plain: `format` below; chat: the tokenizer's chat template with a system and a user message",
    )
    format: str = Field("{prompt}\nAnswer:", description="plain template; {prompt} is the problem statement")
    system: str | None = Field(None, description="system message for chat templates (none: user message only)")
    instruction: str = Field(
        "", description="appended to the problem in chat templates, e.g. 'Put the final answer in \\\\boxed{}.'"
    )


def format_prompt(problem: str, config: PromptConfig, tokenizer=None) -> str:
    if config.template == "plain":
        return config.format.replace("{prompt}", problem)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompt template 'chat' needs a tokenizer with a chat template (the policy checkpoint's)")
    messages = ([{"role": "system", "content": config.system}] if config.system else []) + [
        {"role": "user", "content": f"{problem}\n{config.instruction}".rstrip() if config.instruction else problem}
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
