"""Benchmarks speak JSON, and the figures in the docs come from their result files (bench/results.py, bench/docs.py)."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess

import pytest

from bench.docs import PAGES, literal_figures, render, templates
from bench.results import ROOT, changed_since, envelope, load_results
from conftest import BIN

BENCHMARKS = ("advantages_scale", "dedup_scaling", "faults", "learning", "orchestration", "overlap", "peer",
              "sampling", "sandbox_files", "sandbox_hostile", "sandbox_rate", "startup", "train_throughput",
              "verify_throughput")
HAS_HISTORY = shutil.which("git") is not None and (ROOT / ".git").exists()


def test_a_benchmark_prints_one_json_object_and_its_report_on_stderr(tmp_path):
    result = subprocess.run([str(BIN / "rlvr"), "bench", "dedup", "--sizes", "300,600", "--repeats", "1",
                             "--format", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout)                      # the whole of stdout is one object
    assert outcome["benchmark"] == "dedup" and outcome["parameters"] == {"sizes": "300,600", "repeats": 1}
    assert [row["size"] for row in outcome["figures"]["sizes"]] == [300, 600]
    assert outcome["figures"]["sizes"][1]["time_ratio_to_previous"] > 0
    assert outcome["host"]["cores"] >= 1 and outcome["host"]["cpu"] and outcome["date"].startswith("20")
    assert "bench/dedup_scaling.py" in outcome["depends_on"]
    assert "300 problems" in result.stderr                   # the human report, out of the way


def test_save_writes_the_object_under_its_name(tmp_path, monkeypatch):
    from bench.results import save

    path = save(envelope("dedup", {"seconds": 1.5}, {"repeats": 1}, ("bench/dedup_scaling.py",)), "dedup", tmp_path)
    assert json.loads(path.read_text())["figures"] == {"seconds": 1.5} and path.name == "dedup.json"
    with pytest.raises(ValueError, match="a result name"):
        save({}, "../elsewhere", tmp_path)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_docs_figures_are_rendered_from_the_result_files(page):
    """Every figure region of the page is what its template renders from bench/results/ (a placeholder that names
    a missing field fails here); `python -m bench.docs` re-renders them."""
    text = page.read_text()
    assert render(text, load_results()) == text, f"{page.name} is stale: run `python -m bench.docs`"


def test_benchmarks_page_has_no_figure_written_by_hand():
    """Outside placeholders the benchmarks page holds digits only in inline code, targets and comments."""
    page = ROOT / "docs" / "benchmarks.md"
    assert literal_figures(templates(page.read_text())) == []


def test_the_hand_written_figure_rule_can_fail():
    assert literal_figures("it took 2.79 s") == ["it took 2.79 s"]
    assert literal_figures("`rlvr bench dedup --sizes 100000` at {{dedup.figures.x:.2f}} s (target ≥ 3)") == []


def test_a_region_without_its_result_names_the_command_that_makes_it():
    text = "<!-- figures dedup `rlvr bench dedup --save dedup`: {{dedup.figures.seconds:.1f}} s -->\nold\n<!-- /figures -->"
    rendered = render(text, {})
    assert "No result on record for dedup: run `rlvr bench dedup --save dedup --format json`" in rendered
    assert render(text, {"dedup": {"figures": {"seconds": 2.25}}}).splitlines()[1] == "2.2 s"


@pytest.mark.skipif(not HAS_HISTORY, reason="no git history here (a source archive)")
@pytest.mark.parametrize("name", sorted(load_results()) or ["(none)"])
def test_each_result_is_from_the_code_it_measures(name):
    """A result's commit is in the history, its run had no uncommitted change to what it measures, and none of the
    files it depends on changed since: else re-run it (`rlvr bench … --save NAME`)."""
    if name == "(none)":
        pytest.skip("no result on record")
    result = load_results()[name]
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{result['commit']}^{{commit}}"])
    assert known.returncode == 0, f"bench/results/{name}.json: commit {result['commit']} is not in this history"
    assert result["dirty"] is False, f"bench/results/{name}.json was measured on uncommitted code"
    assert changed_since(result) == [], (f"bench/results/{name}.json (commit {result['commit'][:7]}) is stale: "
                                         f"changed since: {changed_since(result)}")


@pytest.mark.skipif(not HAS_HISTORY, reason="no git history here (a source archive)")
def test_a_changed_dependency_makes_a_result_stale():
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True).stdout.split()[0]
    assert changed_since({"commit": first, "depends_on": ["bench/"]})


@pytest.mark.parametrize("module", BENCHMARKS)
def test_every_benchmark_names_files_that_exist(module):
    depends_on = importlib.import_module(f"bench.{module}").DEPENDS_ON
    assert f"bench/{module}.py" in depends_on
    for path in depends_on:
        assert (ROOT / path.removeprefix(":(exclude)")).exists(), path
