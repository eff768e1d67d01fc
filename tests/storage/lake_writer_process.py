"""A second process that writes a lake on command, for tests of what another process's reads see.

One JSON command a line on stdin, one JSON answer a line on stdout:
  {"do": "open", "lake": URI}                                   use this lake from now on
  {"do": "start", "count": N}                                   start N runs, held open; answers their ids
  {"do": "write", "run": ID, "table": T, "slice": K, "rows": N}  replace slice K of T with N rows under run ID
  {"do": "complete" | "fail" | "abandon", "run": ID}            end the run so
  {"do": "compact", "tables": [T, ...]}                         `rlvr lake maintain`'s compaction of those tables
  {"do": "quit"}
A failure answers {"error": text}.
"""

from __future__ import annotations

import json
import sys
import traceback
from contextlib import ExitStack

import polars as pl

from storage.lake import Lake, LakeError
from storage.maintenance import MaintenanceConfig, maintain
from storage.runs import utc_now

SLICE_COLUMN = {"dbb_state": "iteration", "quarantine": "bank_version"}


def rows(table: str, slice_value: int, count: int, tag: str) -> pl.DataFrame:
    """`count` rows of slice `slice_value`, told apart by `tag` (who wrote them)."""
    if table == "dbb_state":
        return pl.DataFrame(
            {
                "iteration": [slice_value] * count,
                "problem_id": [f"p{i:03d}" for i in range(count)],
                "dbb_alpha": [float(i) for i in range(count)],
                "dbb_beta": [1.0] * count,
                "run_id": [tag] * count,
            }
        )
    return pl.DataFrame(
        {
            "bank_version": [slice_value] * count,
            "source": [tag] * count,
            "source_uri": [f"file-{i}" for i in range(count)],
            "reason": [f"r{i}" for i in range(count)],
            "run_id": [tag] * count,
        }
    )


def main() -> None:
    lake: Lake | None = None
    held: dict[str, tuple[ExitStack, object]] = {}
    for line in sys.stdin:
        command = json.loads(line)
        try:
            what = command["do"]
            if what == "quit":
                print(json.dumps({}), flush=True)
                break
            if what == "open":
                for stack, _ in held.values():
                    stack.close()
                held.clear()
                lake, answer = Lake.open(command["lake"]), {}
            elif what == "start":
                ids = []
                for _ in range(command["count"]):
                    stack = ExitStack()
                    run = stack.enter_context(lake.run("other-process", "write", {}))
                    held[run.run_id] = (stack, run)
                    ids.append(run.run_id)
                answer = {"runs": ids}
            elif what == "write":
                _, run = held[command["run"]]
                table, value = command["table"], command["slice"]
                lake.replace(table, rows(table, value, command["rows"], run.run_id), {SLICE_COLUMN[table]: value}, run)
                answer = {}
            elif what in ("complete", "fail", "abandon"):
                stack, run = held.pop(command["run"])
                if what == "complete":
                    stack.close()
                elif what == "fail":
                    stack.__exit__(RuntimeError, RuntimeError("failed on command"), None)
                else:  # as the reaper marks a dead process's run
                    lake._write_run_row(run.row("abandoned", utc_now(), "abandoned on command"), only_if_running=True)
                    try:
                        stack.close()
                    except LakeError:  # "was marked abandoned while it worked": as it should
                        pass
                answer = {}
            elif what == "compact":
                done = maintain(lake, MaintenanceConfig(tables=command["tables"], checkpoint=False, vacuum=False))
                answer = {"compacted": [entry.compacted for entry in done]}
            else:
                answer = {"error": f"unknown command {what!r}"}
        except Exception:  # said to the test, which fails naming it
            answer = {"error": traceback.format_exc()[-2000:]}
        print(json.dumps(answer), flush=True)
    for stack, _ in held.values():  # runs still open end as a process's runs do on exit
        stack.__exit__(SystemExit, SystemExit(0), None)


if __name__ == "__main__":
    main()
