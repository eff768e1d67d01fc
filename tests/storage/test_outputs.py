"""A stage's outputs as one value, committed by one lake call with its run (`storage/outputs.py`)."""

from helpers import method_calls, method_calls_in_flows, quarantine_rows

from storage.outputs import Outputs

WRITES = {"replace", "append", "clear"}


def test_a_stages_outputs_commit_in_order_with_its_run(lake):
    with lake.run("test-flow", "test-stage", {}) as first:
        versions = lake.commit(
            Outputs()
            .replace("quarantine", quarantine_rows(1, ["a", "b"]), {"bank_version": 1})
            .replace("quarantine", quarantine_rows(2, ["c"]), {"bank_version": 2})
            .clear("quarantine", {"bank_version": 3}),  # nothing there: no commit
            first,
        )
    assert versions[2] is None and versions[0] < versions[1]
    with lake.run("test-flow", "test-stage", {}) as second:
        outputs = Outputs().replace("quarantine", quarantine_rows(1, ["d"]), {"bank_version": 1})
        lake.commit(outputs.clear("quarantine", {"bank_version": 2}), second)
    table = lake.read("quarantine")
    assert table.select("bank_version", "source").rows() == [(1, "d")]
    assert table["run_id"].to_list() == [second.run_id]
    assert outputs.tables() == ["quarantine", "quarantine"]


def test_outputs_of_a_failed_run_stay_invisible(lake):
    try:
        with lake.run("test-flow", "test-stage", {}) as run:
            lake.commit(Outputs().replace("quarantine", quarantine_rows(1, ["a"]), {"bank_version": 1}), run)
            raise RuntimeError("the stage failed after its write")
    except RuntimeError:
        pass
    assert lake.read("quarantine").is_empty()


def test_flows_write_tables_only_through_commit():
    """Stages return their frames; a flow writes them with one `lake.commit(outputs, run)` per run."""
    assert method_calls_in_flows(WRITES, on="lake") == {}
    source = 'lake.replace("rollouts", rows, key, run)\nlake.commit(outputs, run)\nrows.clear()\n'
    assert method_calls(source, WRITES, on="lake") == [1]
