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


def problem_id(domain: str, prompt: str, answer: str | None, tests: str | None) -> str:
    """16 hex characters of SHA-256 over what makes the problem itself; stable across runs and machines."""
    content = "\x1f".join([domain, prompt.strip(), (answer or "").strip(), (tests or "").strip()])
    return hashlib.sha256(content.encode()).hexdigest()[:16]
