"""SQL over the lake: views over every table, time travel, output formats, errors without tracebacks."""

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from conftest import run_cli
from helpers import write

from storage.catalog import open_catalog


def test_every_table_is_a_view(lake):
    write(lake, 1, ["a", "b"])
    connection = open_catalog(lake)
    assert connection.sql("select count(*) from quarantine").fetchall() == [(2,)]
    assert connection.sql("select count(*) from runs where status = 'completed'").fetchall() == [(1,)]
    joined = connection.sql(
        "select q.source, r.flow from quarantine q join runs r using (run_id) order by 1"
    ).fetchall()
    assert joined == [("a", "test-flow"), ("b", "test-flow")]


def test_as_of_a_lake_version_and_a_timestamp(lake):
    write(lake, 1, ["first"])
    version_after_first = lake.runs_version()
    moment = datetime.now(UTC).isoformat()
    write(lake, 1, ["second"])
    old = open_catalog(lake, as_of=version_after_first)
    assert old.sql("select source from quarantine").fetchall() == [("first",)]
    assert old.sql("select count(*) from runs").fetchall() == [(1,)]
    by_time = open_catalog(lake, as_of=moment)
    assert by_time.sql("select source from quarantine").fetchall() == [("first",)]
    assert open_catalog(lake).sql("select source from quarantine").fetchall() == [("second",)]


@pytest.fixture
def local_lake_with_rows(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    write(lake, 1, ["a", "b"])
    return lake


def test_cli_formats(local_lake_with_rows):
    lake = local_lake_with_rows.uri
    csv_out = run_cli("sql", "select source, source_line from quarantine order by 1", "--format", "csv", "--lake", lake)
    assert csv_out.returncode == 0, csv_out.stderr
    assert csv_out.stdout == "source,source_line\na,1\nb,2\n"
    json_out = run_cli("sql", "select source from quarantine order by 1", "--format", "json", "--lake", lake)
    assert [json.loads(line) for line in json_out.stdout.splitlines()] == [{"source": "a"}, {"source": "b"}]
    table_out = run_cli("sql", "select count(*) as n from quarantine", "--lake", lake)
    assert "│ 2 │" in table_out.stdout and "1 row(s)" in table_out.stdout


def test_cli_reads_the_lake_from_the_environment(local_lake_with_rows):
    result = run_cli(
        "sql", "select count(*) as n from quarantine", "--format", "csv", env={"RLVR_LAKE": local_lake_with_rows.uri}
    )
    assert result.stdout == "n\n2\n"


def test_cli_time_travel(local_lake_with_rows):
    lake = local_lake_with_rows
    first = lake.runs_version()
    write(lake, 1, ["c"])
    result = run_cli(
        "sql", "select source from quarantine order by 1", "--format", "csv", "--as-of", str(first), "--lake", lake.uri
    )
    assert result.stdout == "source\na\nb\n"


def test_query_errors_are_duckdbs_message_not_a_traceback(local_lake_with_rows):
    result = run_cli("sql", "select nope from quarantine", "--lake", local_lake_with_rows.uri)
    assert result.returncode == 1
    assert 'Referenced column "nope" not found' in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_read_only_commands_do_not_import_prefect(local_lake_with_rows):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli.main import app\n"
        f"lake = {local_lake_with_rows.uri!r}\n"
        "runner = CliRunner()\n"
        "assert runner.invoke(app, ['sql', 'select 1', '--lake', lake]).exit_code == 0\n"
        "runner.invoke(app, ['bank', 'stats', '--lake', lake])\n"
        "runner.invoke(app, ['lineage', 'problem', 'x', '--lake', lake])\n"
        "assert runner.invoke(app, ['doctor', '--lake', lake]).exit_code == 0\n"
        "runner.invoke(app, ['policy', 'list', '--lake', lake])\n"
        "print('prefect' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
