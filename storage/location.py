"""Where the lake lives: a local folder or an `s3://bucket/prefix`, chosen in one place.

The local and S3 variants differ only in their base URI and in the options handed to delta-rs
and s3fs; everything above this module is written once for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import fsspec

DEFAULT_LAKE = "./lake"
LAKE_ENV = "RLVR_LAKE"
# The AWS variables every S3 client of the lake reads (delta-rs, s3fs, Arrow's S3 filesystem): one list, so that
# a variable one client honours, the others honour too
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL")


def aws_settings() -> dict[str, str]:
    """The AWS variables set (and not empty) in the environment."""
    return {name: os.environ[name] for name in AWS_VARIABLES if os.environ.get(name)}


@dataclass(frozen=True)
class LakeLocation:
    """The root of the lake: an absolute local path or an `s3://bucket/prefix` URI."""

    uri: str

    @classmethod
    def resolve(cls, uri: str | None = None) -> LakeLocation:
        """`--lake URI` first, then `$RLVR_LAKE`, then `./lake`."""
        chosen = uri or os.environ.get(LAKE_ENV) or DEFAULT_LAKE
        if chosen.startswith("s3://"):
            bucket_and_prefix = chosen[len("s3://") :].strip("/")
            if not bucket_and_prefix:
                raise ValueError(f"lake URI {chosen!r} names no bucket")
            return cls("s3://" + bucket_and_prefix)
        if "://" in chosen and not chosen.startswith("file://"):
            raise ValueError(f"lake URI {chosen!r}: only local paths and s3://bucket/prefix are supported")
        return cls(str(Path(chosen.removeprefix("file://")).expanduser().resolve()))

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def table_uri(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def path(self, *parts: str) -> str:
        """A location under the lake root for non-table objects (checkpoints, reports)."""
        return "/".join([self.uri, *parts])

    def storage_options(self) -> dict[str, str]:
        """Options for delta-rs. Local tables need none; S3 takes the standard AWS variables.

        `conditional_put=etag` lets concurrent writers commit safely on S3-compatible stores
        without a locking service.
        """
        if not self.is_s3:
            return {}
        options = {"conditional_put": "etag", **aws_settings()}
        if os.environ.get("AWS_ALLOW_HTTP"):  # delta-rs's own switch; the other clients go by the scheme
            options["AWS_ALLOW_HTTP"] = os.environ["AWS_ALLOW_HTTP"]
        endpoint = options.get("AWS_ENDPOINT_URL", "")
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
        return options

    @cached_property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        """An fsspec filesystem for the lake's objects (s3fs on S3, the local one otherwise)."""
        if not self.is_s3:
            return fsspec.filesystem("file")
        return s3_filesystem()


def s3_filesystem() -> fsspec.AbstractFileSystem:
    """s3fs configured from the same AWS variables delta-rs reads."""
    import s3fs

    settings = aws_settings()
    client_kwargs = {"region_name": settings["AWS_REGION"]} if "AWS_REGION" in settings else {}
    return s3fs.S3FileSystem(
        key=settings.get("AWS_ACCESS_KEY_ID"),
        secret=settings.get("AWS_SECRET_ACCESS_KEY"),
        token=settings.get("AWS_SESSION_TOKEN"),
        endpoint_url=settings.get("AWS_ENDPOINT_URL"),
        client_kwargs=client_kwargs,
    )
