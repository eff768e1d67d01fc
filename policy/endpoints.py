"""Inference servers' addresses as users write them: with or without the OpenAI convention's trailing `/v1`.

The judge's `base_url` is written the OpenAI way (`http://host:8000/v1`), the rollout servers' endpoints as
a server's root (`http://host:8000`); a user copies one into the other. Every place that takes an address
reads it through `server_root`, and adds the route it needs (`/v1/completions`, `/collective_rpc`).
"""

from __future__ import annotations


def server_root(url: str) -> str:
    """`url` without trailing slashes and without a trailing `/v1`: `http://h:8000/v1/` -> `http://h:8000`."""
    root = url.strip().rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def openai_base(url: str) -> str:
    """The OpenAI-style base URL, `/v1` included, whichever way `url` was written."""
    return server_root(url) + "/v1"
