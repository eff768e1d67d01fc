from pathlib import Path

import pytest

from storage.location import LakeLocation


def test_default_is_lake_in_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLVR_LAKE", raising=False)
    assert LakeLocation.resolve().uri == str(tmp_path / "lake")


def test_argument_beats_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RLVR_LAKE", str(tmp_path / "from-env"))
    assert LakeLocation.resolve().uri == str(tmp_path / "from-env")
    assert LakeLocation.resolve(str(tmp_path / "from-arg")).uri == str(tmp_path / "from-arg")


def test_s3_uri_keeps_bucket_and_prefix():
    location = LakeLocation.resolve("s3://bucket/some/prefix/")
    assert location.is_s3
    assert location.table_uri("problems") == "s3://bucket/some/prefix/problems"


def test_s3_options_allow_http_endpoints(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    options = LakeLocation.resolve("s3://bucket").storage_options()
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["conditional_put"] == "etag"


@pytest.mark.parametrize("uri", ["gs://bucket/x", "s3://"])
def test_unsupported_locations_are_refused(uri):
    with pytest.raises(ValueError, match="lake URI"):
        LakeLocation.resolve(uri)


def test_relative_paths_become_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert Path(LakeLocation.resolve("sub/lake").uri) == tmp_path / "sub" / "lake"
