"""`rlvr sql` reads and nothing else: every way out of DuckDB's sandbox tried so far is refused with one line,
and the lake is bit-identical afterwards."""

import hashlib
import os
from pathlib import Path

import pytest
from conftest import run_cli
from helpers import write

from storage.catalog import open_lake_catalog
from storage.lake import LakeError

ESCAPES = {
    "overwrite a Delta log": "copy (select 'x') to '{lake}/quarantine/_delta_log/00000000000000000000.json'",
    "read the process environment": "select * from read_blob('/proc/self/environ')",
    "read any file": "select * from read_csv('/etc/passwd')",
    "glob the disk": "select * from glob('/*')",
    "read the lake's files behind the catalog": "select * from parquet_scan('{lake}/quarantine/*/*.parquet')",
    "attach a database file": "attach '{lake}/x.db' as x",
    "attach in memory": "attach ':memory:' as x",
    "install an extension": "install httpfs",
    "load an extension": "load httpfs",
    "change a setting": "set enable_external_access = true",
    "create a secret": "create secret (type s3, key_id 'a', secret 'b')",
    "export the database": "export database '{lake}/export'",
    "create a table": "create table t as select 1",
    "a second statement": "select 1; copy (select 1) to '{lake}/out.csv'",
}


def fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def local_lake(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    write(lake, 1, ["a", "b"])
    return lake


@pytest.mark.parametrize("escape", ESCAPES)
def test_each_escape_is_refused_and_the_lake_is_unchanged(local_lake, escape):
    before = fingerprint(Path(local_lake.uri))
    catalog = open_lake_catalog(local_lake)
    with pytest.raises((LakeError, Exception)) as refused:
        relation = catalog.sql(ESCAPES[escape].format(lake=local_lake.uri))
        if relation is not None:
            relation.fetchall()
    message = str(refused.value)
    assert "only reads" in message or "disabled by configuration" in message or "Permission Error" in message, message
    assert fingerprint(Path(local_lake.uri)) == before
    assert catalog.sql("select count(*) from quarantine").fetchall() == [(2,)]  # still answers queries


def test_the_command_line_refuses_in_one_line_and_shows_no_secret(local_lake):
    before = fingerprint(Path(local_lake.uri))
    secret = {"AWS_SECRET_ACCESS_KEY": "do-not-print-me"}
    for query in (
        ESCAPES["overwrite a Delta log"].format(lake=local_lake.uri),
        ESCAPES["read the process environment"],
        "attach ':memory:' as x",
    ):
        result = run_cli("sql", query, "--lake", local_lake.uri, env=secret)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0, result.stderr
        assert "do-not-print-me" not in result.stderr
    assert fingerprint(Path(local_lake.uri)) == before
    again = run_cli("sql", "select count(*) as n from quarantine", "--format", "csv", "--lake", local_lake.uri)
    assert again.stdout == "n\n2\n"


def test_queries_of_every_kind_still_work(local_lake):
    catalog = open_lake_catalog(local_lake)
    for query in (
        "with q as (select * from quarantine) select count(*) from q",
        "from quarantine select source",
        "describe quarantine",
        "show tables",
        "summarize quarantine",
        "explain select * from quarantine",
        "select 1; select 2",
    ):
        assert catalog.sql(query).fetchall(), query
    assert os.path.isdir(local_lake.uri)
