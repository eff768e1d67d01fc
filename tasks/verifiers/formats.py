"""Format reward: is the answer given in the required form? A component of its own, beside correctness."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.verifiers.base import Verdict, register
from tasks.verifiers.extract import all_boxed, final_answers

REQUIRED_FORM = {"math": "boxed", "code": "code_block", "logic": "answer_tag", "qa": "any"}


def has_form(response: str, form: str) -> bool:
    if form == "boxed":
        return bool(all_boxed(response))
    if form == "hash":
        return bool(re.search(r"^\s*####\s*\S", response, re.MULTILINE))
    if form == "answer_tag":
        return bool(re.search(r"<answer>.*?</answer>", response, re.DOTALL | re.IGNORECASE))
    if form == "code_block":
        return bool(re.search(r"```(?:python|py)?\s*\n.*?```", response, re.DOTALL))
    if form == "any":
        return bool(final_answers(response)) or bool(response.strip())
    raise ValueError(f"unknown answer form {form!r}")


def format_reward(domain: str, response: str, form: str | None = None) -> float:
    return float(has_form(response, form or REQUIRED_FORM.get(domain, "any")))


@register("format")
@dataclass
class FormatVerifier:
    form: str | None = None  # boxed, hash, answer_tag, code_block, any; default per domain
    name: str = "format"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        reward = format_reward(problem.get("domain", "math"), response, self.form)
        return Verdict(reward, None, {"form": self.form or REQUIRED_FORM.get(problem.get("domain", "math"), "any")})
