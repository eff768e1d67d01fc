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


def test_every_s3_client_reads_the_same_aws_variables(monkeypatch):
    """delta-rs's options, s3fs and Arrow's S3 filesystem are configured from one list (`AWS_VARIABLES`): a
    session token reaches all three (s3fs once went without it, so temporary credentials failed there)."""
    from storage.arrow_reads import table_filesystem
    from storage.location import AWS_VARIABLES, s3_filesystem

    values = {
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "token",
        "AWS_REGION": "eu-west-3",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    assert set(AWS_VARIABLES) == set(values)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    options = LakeLocation.resolve("s3://bucket").storage_options()
    assert {name: options[name] for name in values} == values
    s3fs = s3_filesystem()
    assert (s3fs.key, s3fs.secret, s3fs.token, s3fs.endpoint_url, s3fs.client_kwargs) == (
        "key",
        "secret",
        "token",
        "http://127.0.0.1:9",
        {"region_name": "eu-west-3"},
    )
    arrow = table_filesystem("s3://bucket/rollouts").base_fs.__reduce__()[1][0]  # its constructor's options
    assert {
        key: arrow[key]
        for key in ("access_key", "secret_key", "session_token", "region", "endpoint_override", "scheme")
    } == {
        "access_key": "key",
        "secret_key": "secret",
        "session_token": "token",
        "region": "eu-west-3",
        "endpoint_override": "127.0.0.1:9",
        "scheme": "http",
    }
