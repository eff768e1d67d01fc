"""Which saved results describe older code, and how to refresh them: `rlvr bench stale`, `make bench-refresh`.

A result names its commit and the files its figures depend on (`DEPENDS_ON`); a figure on the docs pages is
always printed with that commit, date and host. Once a dependency changes after the result's commit, the
figure is still true of the code it names, just not of today's: information, not a failure (asv and CodSpeed
tie figures to code the same way). `stale()` lists each such result with the files that changed and the
command that refreshes it (the one its docs region names); `refresh()` re-runs them one at a time, then
renders the pages. A regression is caught by comparing two commits in one run instead: `rlvr bench compare`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.docs import PAGES, commands
from bench.docs import main as render_docs
from bench.results import MODULES, RESULTS, ROOT, changed_since, depends_on, git, load_results

ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


@dataclass(frozen=True)
class Stale:
    name: str  # the result file's name (bench/results/NAME.json)
    benchmark: str  # the benchmark that wrote it
    commit: str | None  # the code it was measured on
    date: str
    reason: str  # "changed", "unknown commit" or "uncommitted code"
    changed: tuple[str, ...]  # the dependencies that changed since its commit (working tree included)
    command: str  # what refreshes it


def refresh_command(name: str, known: dict[str, str]) -> str:
    """The command of the docs region that shows the result, else the benchmark's bare command."""
    return known.get(name, f"rlvr bench … --save {name}")


def stale(folder: Path = RESULTS, pages: tuple[Path, ...] = PAGES) -> list[Stale]:
    """Every result whose figures no longer describe the working tree's code, oldest first."""
    known = commands("".join(page.read_text() for page in pages if page.exists()))
    found = []
    for name, result in load_results(folder).items():
        commit, benchmark = result.get("commit"), result.get("benchmark", "?")
        also = depends_on(benchmark) if benchmark in MODULES else ()
        if (
            not commit
            or subprocess.run(
                ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
            ).returncode
            != 0
        ):
            reason, changed = "unknown commit", tuple(sorted(set(result.get("depends_on", ())) | set(also)))
        elif result.get("dirty"):
            reason, changed = "uncommitted code", ()
        else:
            changed = tuple(changed_since(result, also=also))
            reason = "changed"
            if not changed:
                continue
        found.append(
            Stale(name, benchmark, commit, result.get("date", ""), reason, changed, refresh_command(name, known))
        )
    return sorted(found, key=lambda entry: (entry.date, entry.name))


def describe(entries: list[Stale]) -> str:
    """The list for people: one paragraph a result."""
    if not entries:
        return "No result is stale: every figure describes the code checked out."
    head = git("rev-parse", "--short", "HEAD").strip()
    lines = [
        f"{len(entries)} result(s) measured on code older than the working tree (HEAD {head}); each figure "
        "still names its commit and date. Refresh one with its command, or all with `make bench-refresh`:"
    ]
    for entry in entries:
        files = ", ".join(entry.changed[:6]) + (f" and {len(entry.changed) - 6} more" if len(entry.changed) > 6 else "")
        why = {
            "changed": f"changed since: {files}",
            "unknown commit": "its commit is not in this history",
            "uncommitted code": "measured on uncommitted code",
        }[entry.reason]
        lines.append(f"  {entry.name} ({str(entry.commit)[:7]}, {entry.date[:10]}): {why}\n    {entry.command}")
    return "\n".join(lines)


def refresh(
    entries: list[Stale],
    rlvr: str = str(Path(sys.executable).parent / "rlvr"),
    folder: Path = RESULTS,
    pages: tuple[Path, ...] = PAGES,
) -> int:
    """Re-run each stale result's command in turn (oldest first), then render the pages from the results in
    `folder`. Returns how many commands failed; a failed one leaves its old result in place."""
    failed = 0
    for number, entry in enumerate(entries, 1):
        words = shlex.split(entry.command)
        settings = {}
        while words and ASSIGNMENT.fullmatch(words[0]):  # `ATEN_CPU_CAPABILITY=avx2 rlvr bench …`
            name, _, value = words.pop(0).partition("=")
            settings[name] = value
        if words[:2] != ["rlvr", "bench"] or "…" in entry.command:
            print(
                f"[{number}/{len(entries)}] {entry.name}: no command on record (no docs region shows it); skipped",
                flush=True,
            )
            failed += 1
            continue
        print(f"[{number}/{len(entries)}] {entry.command}", flush=True)
        if subprocess.run([rlvr, *words[1:]], cwd=ROOT, env={**os.environ, **settings}).returncode != 0:
            print(f"  {entry.name}: the command failed; bench/results/{entry.name}.json is unchanged", flush=True)
            failed += 1
    render_docs([], folder, pages)
    return failed


def main(argv: list[str]) -> int:
    entries = stale()
    print(describe(entries), flush=True)
    if "--refresh" in argv and entries:
        return 1 if refresh(entries) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
