"""`rlvr doctor`: is the lake whole, and what can be put right without losing anything committed.

Each check returns findings: what was found, what it means, and what `--repair` does about it.
Repairs only ever touch what no reader sees: runs whose process died are marked `abandoned`, rows of
runs that never completed are deleted (readers already leave them out), checkpoint folders no
model version names are removed, dead holders' leases are taken over and released, and files that
no table version references are vacuumed by Delta's own rules (older than its 7-day retention).
Rows of completed runs are never deleted; a damaged log or a lost commit is reported, for a human.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow.compute as pc

from storage import leases, presence
from storage.lake import Lake, LakeError, retry_on_conflict
from storage.maintenance import last_maintenance, layout
from storage.registry import claim_record, reclaimable
from storage.schemas import TABLES

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass
class Finding:
    severity: str  # error: data unreadable or lost; warning: needs a repair; info: all is well, or in progress
    subject: str  # a table, a run, a lease, a folder
    what: str
    meaning: str
    repair: str = ""  # what --repair does ("" when it takes a human)
    repaired: bool = False


def diagnose(lake: Lake, repair: bool = False) -> list[Finding]:
    """Every check, in order; with `repair`, each repairable finding is repaired as it is found."""
    findings = check_tables(lake)
    readable = {name for name in TABLES if not any(f.subject == name and f.severity == ERROR for f in findings)}
    if "runs" not in readable:
        return findings + [
            Finding(
                ERROR,
                "runs",
                "the lineage spine cannot be read",
                "no run's status is known, so no row's visibility can be decided",
            )
        ]
    findings += check_runs(lake, readable, repair)
    findings += check_problems(lake, readable)
    findings += check_checkpoints(lake, readable, repair)
    findings += check_leases(lake, repair)
    findings += check_unreferenced_files(lake, readable, repair)
    findings += check_layout(lake, readable)
    return findings


def check_tables(lake: Lake) -> list[Finding]:
    """Each table's log loads, the files its current version names exist, and no completed run recorded a
    commit newer than the table has (a lost log file)."""
    findings, versions = [], {}
    for name in TABLES:
        try:
            table = lake.table(name)
        except LakeError as error:
            findings.append(
                Finding(
                    ERROR,
                    name,
                    f"its log cannot be read: {str(error).split('(', 1)[-1][:200]}",
                    "every read of this table fails; the other tables are unaffected; restore the "
                    "log file from a backup",
                )
            )
            continue
        if table is None:
            continue
        versions[name] = table.version()
        missing = _missing_files(lake, name, table)
        if missing:
            findings.append(
                Finding(
                    ERROR,
                    name,
                    f"{len(missing)} data file(s) its log names are missing (e.g. {missing[0]})",
                    "reads of this table fail; restore the files from a "
                    "backup (Delta's `repair` would drop their rows from the table)",
                )
            )
    if "runs" in versions:
        recorded: dict[str, tuple[int, str]] = {}
        runs = lake.read("runs", filter=pc.field("status") == "completed", columns=["run_id", "table_versions"])
        for run_id, text in runs.rows():
            for name, version in json.loads(text or "{}").items():
                if version > recorded.get(name, (-1, ""))[0]:
                    recorded[name] = (version, run_id)
        for name, (version, run_id) in sorted(recorded.items()):
            if name in versions and versions[name] < version:
                findings.append(
                    Finding(
                        ERROR,
                        name,
                        f"at version {versions[name]}, but run {run_id} committed version {version}",
                        "commits of completed runs were lost (a log file was "
                        "deleted); their rows are gone until the log is restored from a backup",
                    )
                )
    if not findings:
        findings.append(
            Finding(
                INFO,
                "tables",
                f"{len(versions)} table(s): every log and data file is in place",
                "all tables are readable",
            )
        )
    return findings


def _missing_files(lake: Lake, name: str, table) -> list[str]:
    """Files the table's current version names that are not in its folder (one listing, not one request each)."""
    fs = lake.location.filesystem
    root = lake.location.table_uri(name).removeprefix("s3://")
    fs.invalidate_cache(root)
    present = {path.removeprefix("file://") for path in fs.find(root)}
    named = [uri.removeprefix("s3://").removeprefix("file://") for uri in table.file_uris()]
    return [path for path in named if path not in present]


def check_runs(lake: Lake, readable: set[str], repair: bool) -> list[Finding]:
    """Runs whose process died (still `running`), and rows of runs that never completed."""
    findings = []
    dead = lake.dead_runs()
    for row, reason in dead:
        findings.append(
            Finding(
                WARNING,
                f"run {row['run_id']}",
                f"{row['flow']}/{row['stage']} still `running`, but {reason.removeprefix('abandoned: ')}",
                "its rows are invisible to every reader and the next run of its stage replaces them",
                "mark it abandoned",
            )
        )
    if repair and dead:
        abandoned = set(lake.reap())
        for finding in findings:
            finding.repaired = finding.subject.removeprefix("run ") in abandoned
    running = lake.read("runs", filter=pc.field("status") == "running", columns=["run_id"])["run_id"].to_list()
    in_progress = set(running) - {row["run_id"] for row, _ in dead}
    if in_progress:
        findings.append(
            Finding(
                INFO,
                "runs",
                f"{len(in_progress)} run(s) in progress in live processes",
                "their rows become visible when they complete",
            )
        )
    unfinished = lake.hidden_runs() - in_progress
    for name in sorted(readable - {"runs"}):
        if "run_id" not in TABLES[name].schema.names or not unfinished:
            continue
        counts = lake.read(name, filter=pc.field("run_id").isin(sorted(unfinished)), columns=["run_id"], raw=True)
        if counts.is_empty():
            continue
        finding = Finding(
            WARNING,
            name,
            f"{counts.height} row(s) of {counts['run_id'].n_unique()} run(s) that never completed",
            "invisible to every reader (SQL, mixes, dedup, lineage)",
            "delete them",
        )
        if repair:
            with lake.run("doctor", "repair", {"table": name, "runs": sorted(set(counts["run_id"]))}) as run:
                lake.remove_rows_of_runs(name, sorted(set(counts["run_id"])), run)
            finding.repaired = True
        findings.append(finding)
    return findings


def check_problems(lake: Lake, readable: set[str]) -> list[Finding]:
    if "problems" not in readable:
        return []
    ids = lake.read("problems", columns=["problem_id"])["problem_id"]
    repeated = ids.filter(ids.is_duplicated()).unique()
    if repeated.len():
        return [
            Finding(
                ERROR,
                "problems",
                f"{repeated.len()} problem id(s) appear more than once (e.g. {repeated[0]})",
                "training mixes can draw a problem twice; the lake's writes refuse this, so it was written "
                "by an older version or by hand",
            )
        ]
    return []


def check_checkpoints(lake: Lake, readable: set[str], repair: bool) -> list[Finding]:
    """Every model version's checkpoint exists; no checkpoint folder is left that no version names."""
    if "model_versions" not in readable:
        return []
    fs = lake.location.filesystem
    visible = lake.read("model_versions", columns=["model_version", "checkpoint_uri"])
    findings = []
    for version, uri in visible.rows():
        path = uri.removeprefix("s3://")
        if not any(fs.exists(f"{path}/{name}") for name in ("config.json", "adapter_config.json")):
            findings.append(
                Finding(
                    ERROR,
                    f"model version {version}",
                    f"its checkpoint {uri} is missing",
                    "sampling or training from this version fails",
                )
            )
    named = {uri.removeprefix("s3://").rstrip("/") for uri in visible["checkpoint_uri"]}
    models = lake.location.path("models").removeprefix("s3://")
    try:
        folders = [p.rstrip("/") for p in fs.ls(models, detail=False)]
    except FileNotFoundError:
        folders = []
    for folder in sorted(set(folders) - named):
        uri = f"s3://{folder}" if lake.location.is_s3 else folder
        claim = claim_record(lake, uri)
        if claim is not None and presence.alive(claim):
            findings.append(
                Finding(
                    INFO,
                    folder,
                    f"a checkpoint being written by {presence.describe(claim)}",
                    "a model version in the making",
                )
            )
            continue
        if not reclaimable(lake, uri):
            findings.append(
                Finding(
                    WARNING,
                    folder,
                    "a checkpoint folder no model version names, written by a completed run or an older version",
                    "its registry row may have been lost (see the table findings); it is kept and never overwritten",
                )
            )
            continue
        finding = Finding(
            WARNING,
            folder,
            "a checkpoint folder no model version names",
            "left by a run that never completed; the next version with its number reclaims it",
            "delete it",
        )
        if repair:
            fs.rm(folder, recursive=True)
            finding.repaired = True
        findings.append(finding)
    return findings


def check_leases(lake: Lake, repair: bool) -> list[Finding]:
    findings = []
    for name in (leases.LOOP, leases.BANK):
        found = leases.holder(lake.location, name)
        if found is None or found.released:
            continue
        if found.alive:
            findings.append(
                Finding(
                    INFO,
                    f"lease {name}",
                    leases.describe_holder(lake.location, name, found),
                    "a writer is at work; others are refused or queue (--wait)",
                )
            )
            continue
        finding = Finding(
            WARNING,
            f"lease {name}",
            f"held by a dead process ({presence.describe(found.record)})",
            "the next writer takes it over (and logs the takeover in `runs`)",
            "take it over and release it",
        )
        if repair:
            with lake.lease(name):
                pass
            finding.repaired = True
        findings.append(finding)
    return findings


def check_unreferenced_files(lake: Lake, readable: set[str], repair: bool) -> list[Finding]:
    """Data files no table version references any more, older than Delta's retention (7 days), and files a
    killed writer left without a commit."""
    findings = []
    for name in sorted(readable):
        table = lake.table(name)
        if table is None:
            continue
        removable = table.vacuum(dry_run=True, full=True)
        if not removable:
            continue
        finding = Finding(
            INFO,
            name,
            f"{len(removable)} file(s) no version references, older than the retention",
            "disk space only: time travel within the retention keeps its files",
            "vacuum them",
        )
        if repair:
            retry_on_conflict(lambda name=name: lake.table(name).vacuum(dry_run=False, full=True), f"vacuum {name}")
            finding.repaired = True
        findings.append(finding)
    return findings


def check_layout(lake: Lake, readable: set[str]) -> list[Finding]:
    """Small files and log checkpoints per table, and the last maintenance: what `rlvr lake maintain` improves
    (information: a lake with small files is whole, only slower to read)."""
    layouts = [found for name in sorted(readable) if (found := layout(lake, name)) is not None]
    if not layouts:
        return []
    small = ", ".join(f"{t.table} {t.small_files} of {t.files}" for t in layouts if t.small_files)
    behind = ", ".join(
        f"{t.table} {'none' if t.last_checkpoint is None else f'v{t.last_checkpoint}'} of v{t.version}"
        for t in layouts
        if t.last_checkpoint != t.version
    )
    findings = [
        Finding(
            INFO,
            "layout",
            f"small files (under 8 MB, several in a partition): {small or 'none'}; log checkpoints behind the "
            f"current version: {behind or 'none'}",
            "reads open every file and replay the log since its last checkpoint: `rlvr lake maintain` "
            "compacts the files and checkpoints the logs",
        )
    ]
    last = last_maintenance(lake)
    findings.append(
        Finding(
            INFO,
            "maintenance",
            "never maintained"
            if last is None
            else f"last maintained {last['ended_at']:%Y-%m-%d %H:%M} UTC (run {last['run_id']})",
            "`rlvr lake maintain`, or the scheduled `lake-maintenance` deployment (configs/deployments.yaml)",
        )
    )
    return findings


def healthy(findings: list[Finding]) -> bool:
    """No error, and no warning left unrepaired."""
    return not any(f.severity == ERROR or (f.severity == WARNING and not f.repaired) for f in findings)
