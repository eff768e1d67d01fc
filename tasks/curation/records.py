"""Problem identity: normalised text and the content hash that is a problem's id."""

from __future__ import annotations

import hashlib
import re
import unicodedata

_SPACE = re.compile(r"\s+")
_TRIVIAL_PUNCTUATION = re.compile(r"[\s.,;:!?'\"`]+$")


def normalise_text(text: str) -> str:
    """Case-, width- and whitespace-insensitive form used by exact deduplication."""
    text = unicodedata.normalize("NFKC", text).lower()
    return _TRIVIAL_PUNCTUATION.sub("", _SPACE.sub(" ", text).strip())


def problem_id(split: str, domain: str, prompt: str, answer: str | None, tests: str | None) -> str:
    """16 hex characters of SHA-256 over what makes the problem and its split; stable across runs and
    machines. The split is part of it so that an evaluation copy never shares a training problem's id."""
    content = "\x1f".join([split, domain, prompt.strip(), (answer or "").strip(), (tests or "").strip()])
    return hashlib.sha256(content.encode()).hexdigest()[:16]
