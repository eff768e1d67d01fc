"""Seeds derived from names: every random choice in the platform (a problem, a draw, a sampling request) takes
its seed from the parts that name it, so the same run config gives the same data in any process and on any host."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (run seed, source, index): same parts, same seed, in any process."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
