"""Figures carry provenance, not a freeze: `rlvr bench stale` lists what older code measured, `make bench-refresh`
re-runs it, `rlvr bench compare` catches a regression between two commits in one run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager

import pytest
from conftest import BIN

import bench.results as results_module
from bench import compare as compare_module
from bench.compare import PROBES, compare, slowdown
from bench.results import ROOT, git
from bench.stale import Stale, refresh, stale
from bench.worktrees import worktree

HAS_HISTORY = shutil.which("git") is not None and (ROOT / ".git").exists()
needs_history = pytest.mark.skipif(not HAS_HISTORY, reason="no git history here (a source archive)")
PAGE = (
    "<!-- figures {name} `rlvr bench dedup --sizes 300 --save {name}`: {{{{{name}.figures.seconds:.1f}}}} s -->\n"
    "old\n<!-- /figures -->\n"
)


@contextmanager
def fake_worktree(revision):
    yield ROOT.parent / "elsewhere", "f" * 40


def first_commit() -> str:
    return git("rev-list", "--max-parents=0", "HEAD").split()[0]


def write_result(folder, name: str, commit: str, depends_on: list[str], dirty: bool = False, date: str = "2026-01-01"):
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(
        json.dumps(
            {
                "benchmark": "dedup",
                "commit": commit,
                "dirty": dirty,
                "date": f"{date}T00:00:00+00:00",
                "depends_on": depends_on,
                "figures": {"seconds": 1.25},
                "parameters": {},
                "host": {},
            }
        )
    )


@needs_history
def test_stale_lists_each_result_older_than_its_code_with_the_files_and_the_command(tmp_path):
    results, page = tmp_path / "results", tmp_path / "page.md"
    page.write_text(PAGE.format(name="old") + PAGE.format(name="fresh"))
    head = git("rev-parse", "HEAD").strip()
    write_result(results, "old", first_commit(), ["bench/dedup_scaling.py"])  # the module changed since
    write_result(results, "fresh", head, ["LICENSE-does-not-exist"])  # nothing of it changed
    write_result(results, "lost", "0" * 40, ["bench/dedup_scaling.py"], date="2025-01-01")
    write_result(results, "local", head, ["bench/dedup_scaling.py"], dirty=True, date="2026-02-01")
    entries = stale(results, (page,))
    assert [(entry.name, entry.reason) for entry in entries] == [
        ("lost", "unknown commit"),
        ("old", "changed"),
        ("local", "uncommitted code"),
    ]
    old = entries[1]
    assert (
        "bench/dedup_scaling.py" in old.changed and "tasks/curation/dedup.py" in old.changed
    )  # today's DEPENDS_ON too
    assert old.command == "rlvr bench dedup --sizes 300 --save old" and old.commit == first_commit()
    assert entries[0].command == "rlvr bench … --save lost"  # no region shows it


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_new_file_git_does_not_track_yet_makes_a_result_stale(tmp_path, monkeypatch):
    """In a repository of the test's own: a file committed and unchanged is not a change, a file git does not
    track yet under a dependency is."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "kept.py").write_text("# committed\n")
    for command in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"],
    ):
        subprocess.run(["git", "-C", str(repo), *command], check=True, capture_output=True)
    monkeypatch.setattr(results_module, "ROOT", repo)
    head = results_module.git("rev-parse", "HEAD").strip()
    assert results_module.changed_since({"commit": head, "depends_on": ["bench/"]}) == []
    (repo / "bench" / "new.py").write_text("# not tracked yet\n")
    assert results_module.changed_since({"commit": head, "depends_on": ["bench/"]}) == ["bench/new.py"]


@needs_history
def test_stale_is_information_it_exits_0_and_make_test_prints_it():
    listed = subprocess.run(
        [str(BIN / "rlvr"), "bench", "stale", "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    for entry in json.loads(listed.stdout):
        assert set(entry) == {"name", "benchmark", "commit", "date", "reason", "changed", "command"}
        assert re.sub(r"^([A-Z_]+=\S+ )+", "", entry["command"]).startswith("rlvr bench ")  # NAME=value first
    # `make test` prints the list after pytest, and its status stays pytest's
    dry = subprocess.run(
        ["make", "-n", "test", f"BIN={BIN}", "-o", f"{BIN}/rlvr"], cwd=ROOT, capture_output=True, text=True
    )
    assert f"{BIN}/rlvr bench stale || true" in dry.stdout and dry.stdout.index("pytest") < dry.stdout.index(
        "bench stale"
    )
    refresh_target = subprocess.run(
        ["make", "-n", "bench-refresh", f"BIN={BIN}", "-o", f"{BIN}/rlvr"], cwd=ROOT, capture_output=True, text=True
    )
    assert "bench.stale --refresh" in refresh_target.stdout


def test_refresh_runs_each_stale_command_then_renders_the_pages(tmp_path):
    """A fake `rlvr` writes the result each command names (with the environment the command sets); a failing
    command leaves its old result."""
    results, page = tmp_path / "results", tmp_path / "page.md"
    page.write_text(PAGE.format(name="one") + PAGE.format(name="two"))
    write_result(results, "one", "x", [])
    write_result(results, "two", "x", [])
    fake = tmp_path / "rlvr"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, pathlib\n"
        "import os\n"
        "name = sys.argv[sys.argv.index('--save') + 1]\n"
        "if name == 'two' or os.environ.get('ATEN_CPU_CAPABILITY') != 'avx2': sys.exit(3)\n"
        f"pathlib.Path({str(results)!r}, name + '.json').write_text(json.dumps({{'figures': {{'seconds': 9.75}}}}))\n"
    )
    fake.chmod(0o755)
    entries = [
        Stale(
            name,
            "dedup",
            "x",
            "",
            "changed",
            (),
            f"ATEN_CPU_CAPABILITY=avx2 rlvr bench dedup --sizes 300 --save {name}",
        )
        for name in ("one", "two")
    ] + [Stale("three", "dedup", "x", "", "changed", (), "rlvr bench … --save three")]
    assert refresh(entries, str(fake), results, (page,)) == 2  # two failed: one exited 3, one has no command
    rendered = page.read_text().splitlines()
    assert rendered[1] == "9.8 s" and rendered[4] == "1.2 s"  # one re-run, two as it was


def test_compare_alternates_the_sides_and_flags_a_slowdown_past_the_threshold(monkeypatch):
    calls = []

    def runner(name, tree, lake):
        side = "here" if tree == ROOT else "base"
        calls.append((name, side))
        if name == "sandbox":  # a rate: 20 % fewer runs a second here
            return {"runs/s": 80.0 if side == "here" else 100.0}
        return {"ours seconds": 1.05 if side == "here" else 1.0}  # 5 % slower: within the threshold

    monkeypatch.setattr(compare_module, "worktree", fake_worktree)
    outcome = compare("HEAD", ["advantages", "sandbox"], repeats=3, runner=runner, say=lambda line: None)
    assert calls[:2] == [("advantages", "here"), ("advantages", "base")]  # a warm-up run of each side
    assert [side for _, side in calls[2:8]] == ["base", "here", "here", "base", "base", "here"]  # alternating
    rows = {row["benchmark"]: row for row in outcome["rows"]}
    assert rows["sandbox"]["slowdown"] == pytest.approx(1.25) and rows["sandbox"]["regressed"]
    assert rows["advantages"]["slowdown"] == pytest.approx(1.05) and not rows["advantages"]["regressed"]
    assert outcome["regressed"] == ["sandbox: runs/s"] and outcome["base"] == "f" * 40
    with pytest.raises(ValueError, match="no fast benchmark 'peer'"):
        compare("HEAD", ["peer"], runner=runner)


def test_a_slowdown_is_cost_over_cost_or_rate_over_rate():
    assert slowdown("seconds", 1.2, 1.0) == pytest.approx(1.2)
    assert slowdown("rate", 50.0, 100.0) == pytest.approx(2.0)
    assert set(PROBES) == {"advantages", "verify", "sandbox", "train", "sampling", "startup"}


@needs_history
def test_a_worktree_of_a_commit_holds_its_code_and_is_removed_after(tmp_path):
    first = first_commit()
    with worktree(first) as (folder, commit):
        assert commit == first and (folder / ".git").exists()
        listed = git("worktree", "list")
        assert str(folder) in listed
    assert not folder.exists() and str(folder) not in git("worktree", "list")
    with pytest.raises(ValueError, match="is not a commit"):
        with worktree("no-such-revision-anywhere"):
            pass


@needs_history
def test_compare_runs_the_real_startup_probe_on_two_trees_and_exits_by_the_threshold():
    done = subprocess.run(
        [
            str(BIN / "rlvr"),
            "bench",
            "compare",
            "--base",
            "HEAD",
            "--only",
            "startup",
            "--repeats",
            "1",
            "--threshold",
            "100",
            "--format",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout)
    assert {row["figure"] for row in outcome["rows"]} == {"rlvr --help seconds", "rlvr sql seconds"}
    assert all(row["here"] > 0 and row["base"] > 0 and len(row["here_runs"]) == 1 for row in outcome["rows"])
    strict = subprocess.run(
        [str(BIN / "rlvr"), "bench", "compare", "--base", "HEAD", "--only", "peer"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert strict.returncode == 2 and "no fast benchmark 'peer'" in strict.stderr
