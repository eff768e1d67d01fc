"""Benchmarks speak JSON, and the figures in the docs come from their result files (bench/results.py, bench/docs.py)."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess

import pytest
from conftest import BIN

import bench.results
from bench.docs import PAGES, REGION, FigureError, commands, literal_figures, main, render, templates
from bench.results import MODULES, ROOT, changed_since, envelope, load_results

HAS_HISTORY = shutil.which("git") is not None and (ROOT / ".git").exists()
REGION_TEXT = (
    "<!-- figures dedup `rlvr bench dedup --save dedup`: {{dedup.figures.seconds:.1f}} s -->\nold\n<!-- /figures -->"
)


def test_a_benchmark_prints_one_json_object_and_its_report_on_stderr(tmp_path):
    result = subprocess.run(
        [str(BIN / "rlvr"), "bench", "dedup", "--sizes", "300,600", "--repeats", "1", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout)  # the whole of stdout is one object
    assert outcome["benchmark"] == "dedup" and outcome["parameters"] == {"sizes": "300,600", "repeats": 1}
    assert [row["size"] for row in outcome["figures"]["sizes"]] == [300, 600]
    assert outcome["figures"]["sizes"][1]["time_ratio_to_previous"] > 0
    assert outcome["host"]["cores"] >= 1 and outcome["host"]["cpu"] and outcome["date"].startswith("20")
    assert "bench/dedup_scaling.py" in outcome["depends_on"]
    assert set(outcome["host"]) == {"cores", "cpu", "cpu_id", "isa", "platform", "python", "load_average"}
    assert isinstance(outcome["dirty"], bool) and outcome["host"]["isa"] in ("avx512", "avx2", "default")
    if HAS_HISTORY:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert outcome["commit"] == head.stdout.strip()
    assert "300 problems" in result.stderr  # the human report, out of the way


def test_a_result_outside_git_has_no_commit(monkeypatch):
    def no_git(*arguments):
        raise OSError("git: not found")

    monkeypatch.setattr(bench.results, "git", no_git)
    outcome = envelope("dedup", {"seconds": 1.5}, {}, ("bench/dedup_scaling.py",))
    assert outcome["commit"] is None and outcome["dirty"] is None and outcome["figures"] == {"seconds": 1.5}


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
    """Outside placeholders the benchmarks page holds digits only in inline code, targets, names and comments."""
    page = ROOT / "docs" / "benchmarks.md"
    assert literal_figures(templates(page.read_text())) == []


def test_the_readme_figure_templates_have_no_figure_written_by_hand():
    """The README's other numbers are counts and versions; its figure regions follow the benchmarks page's rule."""
    regions = list(REGION.finditer((ROOT / "README.md").read_text()))
    assert regions and [match["names"] for match in regions if literal_figures(match["template"])] == []


def test_every_page_with_a_figure_region_is_rendered():
    """A page of docs/ or the README that quotes a result is in PAGES, so `python -m bench.docs` renders it and
    the test above checks it: a region outside PAGES would keep the figures it was written with."""
    quoting = {page for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if REGION.search(page.read_text())}
    assert sorted(map(str, quoting - set(PAGES))) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_region_template_has_no_figure_written_by_hand(page):
    """Outside a region a page may hold counts, defaults and versions; a region's template holds only placeholders."""
    by_hand = [match["names"] for match in REGION.finditer(page.read_text()) if literal_figures(match["template"])]
    assert by_hand == []


def test_a_result_is_quoted_with_one_command_wherever_it_appears():
    """`rlvr bench stale` and a region without its result name the command a result is saved with: the same on
    every page."""
    seen: dict[str, set[str]] = {}
    for page in PAGES:
        for match in REGION.finditer(page.read_text()):
            for name in match["names"].split(","):
                seen.setdefault(name, set()).add(match["command"])
    assert {name: sorted(found) for name, found in seen.items() if len(found) > 1} == {}


def test_the_hand_written_figure_rule_can_fail():
    assert literal_figures("it took 2.79 s") == ["it took 2.79 s"]
    assert literal_figures("`rlvr bench dedup --sizes 100000` at {{dedup.figures.x:.2f}} s (target ≥ 3)") == []


def test_a_region_without_its_result_names_the_command_that_makes_it():
    rendered = render(REGION_TEXT, {})
    assert "No result on record for dedup: run `rlvr bench dedup --save dedup --format json`" in rendered
    assert render(REGION_TEXT, {"dedup": {"figures": {"seconds": 2.25}}}).splitlines()[1] == "2.2 s"
    assert commands(REGION_TEXT) == {"dedup": "rlvr bench dedup --save dedup"}


def test_a_placeholder_its_result_cannot_answer_fails_naming_it():
    with pytest.raises(FigureError, match=r"\{\{dedup.figures.seconds:.1f\}\}: bench/results/dedup.json has no such"):
        render(REGION_TEXT, {"dedup": {"figures": {"second": 2.25}}})
    undeclared = REGION_TEXT.replace("{{dedup.figures", "{{verify.figures")
    with pytest.raises(FigureError, match="result 'verify' is not among the region's names"):
        render(undeclared, {"dedup": {}, "verify": {"figures": {"seconds": 1.0}}})


def test_the_generator_renders_pages_from_a_results_folder(tmp_path, capsys):
    """No result yet, then a result: `--check` fails on the stale page naming the command, a run renders it."""
    page, results = tmp_path / "page.md", tmp_path / "results"
    page.write_text(REGION_TEXT)
    results.mkdir()
    assert main(["--check"], results, (page,)) == 1 and "run `python -m bench.docs`" in capsys.readouterr().out
    assert main([], results, (page,)) == 0 and "No result on record for dedup" in page.read_text()
    assert main(["--check"], results, (page,)) == 0
    (results / "dedup.json").write_text(json.dumps({"figures": {"seconds": 3.14159}}))
    assert main(["--check"], results, (page,)) == 1
    assert main([], results, (page,)) == 0 and page.read_text().splitlines()[1] == "3.1 s"


@pytest.mark.skipif(not HAS_HISTORY, reason="no git history here (a source archive)")
@pytest.mark.parametrize("name", sorted(load_results()) or ["(none)"])
def test_each_result_names_the_committed_code_it_measured(name):
    """A result's commit is in the history of HEAD and its run had no uncommitted change to what it measures: its
    provenance is true. Whether code changed since is information (`rlvr bench stale`), never a failure."""
    if name == "(none)":
        pytest.skip("no result on record")
    result = load_results()[name]
    rerun = f"re-run `{commands(''.join(page.read_text() for page in PAGES)).get(name, f'rlvr bench … --save {name}')}`"
    assert result["benchmark"] in MODULES, f"bench/results/{name}.json: no benchmark {result['benchmark']!r}"
    # An ancestor of HEAD, not merely an object here: a commit amended or reworded away stays in the local object
    # store (and in a local clone of it) but never reaches the clone CI makes of what landed.
    known = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", result["commit"], "HEAD"], capture_output=True
    )
    assert known.returncode == 0, f"bench/results/{name}.json: commit {result['commit']} is not in history; {rerun}"
    assert result["dirty"] is False, f"bench/results/{name}.json was measured on uncommitted code; {rerun}"


@pytest.mark.skipif(not HAS_HISTORY, reason="no git history here (a source archive)")
def test_a_changed_dependency_makes_a_result_stale():
    first = subprocess.run(
        ["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True
    ).stdout.split()[0]
    assert changed_since({"commit": first, "depends_on": ["bench/"]})


def test_every_benchmark_is_registered_with_the_name_its_command_records():
    """A module with a `run_benchmark` is in bench.results.MODULES, under the name its command records it by."""
    measuring = {path.stem for path in (ROOT / "bench").glob("*.py") if "\ndef run_benchmark(" in path.read_text()}
    assert measuring == set(MODULES.values())
    commands = "".join(
        (ROOT / "bench" / name).read_text() for name in ("cli.py", "component_commands.py", "loop_commands.py")
    )
    recorded = dict(re.findall(r'measured\(\s*context,\s*"([\w-]+)",\s*(\w+),', commands))
    assert recorded == MODULES


@pytest.mark.parametrize("module", sorted(MODULES.values()))
def test_every_benchmark_names_files_that_exist(module):
    depends_on = importlib.import_module(f"bench.{module}").DEPENDS_ON
    assert f"bench/{module}.py" in depends_on
    for path in depends_on:
        assert (ROOT / path.removeprefix(":(exclude)")).exists(), path


@pytest.mark.skipif(not HAS_HISTORY, reason="no git history here (a source archive)")
def test_a_result_names_the_commit_its_run_started_on_and_is_dirty_if_its_code_changed_meanwhile():
    from bench.results import code_state

    head = code_state(("bench/",))["commit"]
    first = subprocess.run(
        ["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True
    ).stdout.split()[0]
    earlier = {"commit": first, "dirty": False}  # as if HEAD moved on during the run
    moved = envelope("dedup", {}, {}, ("bench/",), started=earlier)
    assert moved["commit"] == first and moved["dirty"] is True  # bench/ changed between the two commits
    unmoved = envelope("dedup", {}, {}, ("bench/dedup_scaling.py",), started=code_state(("bench/dedup_scaling.py",)))
    assert unmoved["commit"] == head
