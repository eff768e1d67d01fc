"""File- and project-level code problems: the shipped problems, the answer format, partial credit, and
hostile candidates (each scores 0 and changes nothing outside its own run)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import polars as pl
import pytest

from tasks.verifiers.credit import credit, credit_rule
from tasks.workspaces.answer import extract_files
from tasks.workspaces.problem import ProblemError, load_problem, load_problems
from tasks.workspaces.verifier import WorkspaceVerifier

PROBLEMS = {problem.id: problem for problem in load_problems()}
LRU = PROBLEMS["ds-lru-cache"]


@pytest.fixture(scope="module")
def verifier():
    shared = WorkspaceVerifier(partial_credit="fraction")
    yield shared
    shared.close()


def score(verifier, files: dict[str, str], problem=LRU):
    return verifier.run(problem.spec(), files)


def test_enough_problems_of_each_level_ship_with_wrong_solutions():
    files = [p for p in PROBLEMS.values() if p.level == "file"]
    projects = [p for p in PROBLEMS.values() if p.level == "project"]
    assert len(files) >= 30 and len(projects) >= 5
    assert all(problem.wrong for problem in PROBLEMS.values())
    assert all(len(problem.files) >= 2 and problem.perf for problem in projects)
    assert len({problem.topic for problem in files}) >= 5


@pytest.mark.slow
def test_every_reference_passes_and_every_wrong_solution_fails_in_the_sandbox(verifier):
    broken = []
    for problem in PROBLEMS.values():
        verdict = verifier.run(problem.spec(), problem.reference)
        if not verdict.correct:
            broken.append(f"{problem.id}: reference fails {verdict.details.get('failures')}")
        for wrong in problem.wrong:
            if verifier.run(problem.spec(), {**problem.reference, **wrong.files}).correct:
                broken.append(f"{problem.id}: wrong solution passes ({wrong.why})")
    assert broken == []


def test_a_test_result_per_test_with_partial_credit(verifier):
    wrong = LRU.wrong[0]
    verdict = score(verifier, {**LRU.reference, **wrong.files})
    tests = verdict.details["tests"]
    assert (
        len(tests)
        == verdict.details["tests_total"]
        == len([t for source in LRU.tests.values() for t in source.split("\n") if t.strip().startswith("def test")])
    )
    failing = [t["name"] for t in tests if not t["passed"]]
    assert failing and all(name.startswith("test_lru::") for name in failing)
    assert verdict.reward == pytest.approx(verdict.details["tests_passed"] / len(tests))
    json.dumps(verdict.details)  # stored as rewards.details


def test_partial_credit_rules_by_hand():
    assert [credit(3, 3, rule) for rule in ("all_pass", "half", "fraction")] == [1.0, 1.0, 1.0]
    assert [credit(1, 4, rule) for rule in ("all_pass", "half", "fraction")] == [0.0, 0.5, 0.25]
    assert [credit(0, 4, rule) for rule in ("all_pass", "half", "fraction")] == [0.0, 0.0, 0.0]
    assert credit(2, 0, "fraction") == 0.0
    assert credit_rule("seed") == "half" and credit_rule("none") == "all_pass"
    with pytest.raises(ValueError, match="partial_credit must be one of"):
        credit_rule("most")


def test_answers_name_their_files_in_any_of_the_documented_ways():
    wanted = ["kv/store.py", "kv/__init__.py"]
    response = (
        "Here:\n```python kv/store.py\nA = 1\n```\n`kv/__init__.py`:\n```python\nB = 2\n```\n"
        "```python\n# tests/test_kv.py\nimport os\n```\n"
    )
    files, missing = extract_files(response, wanted)
    assert files == {"kv/store.py": "A = 1\n", "kv/__init__.py": "B = 2\n"} and missing == []
    files, missing = extract_files("```python\n# lru.py\nX = 1\n```", ["lru.py"])
    assert files == {"lru.py": "X = 1\n"}
    files, missing = extract_files("```\nX = 1\n```\n```py\nX = 2\n```", ["lru.py"])
    assert files == {"lru.py": "X = 2\n"}  # one file: the last unnamed block
    assert extract_files("no code", ["lru.py"]) == ({}, ["lru.py"])


def test_a_response_missing_a_file_scores_zero_with_the_reason(verifier):
    project = next(p for p in PROBLEMS.values() if p.level == "project")
    first = project.files[0]
    response = f"```python {first}\n{project.reference[first]}```\n"
    verdict = verifier.verify({"tests": json.dumps(project.spec())}, response)
    assert verdict.reward == 0 and "missing file" in verdict.details["reason"]


def test_a_problem_file_with_a_bad_field_names_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "id: Bad_Id\nlevel: file\ndifficulty: 2\ntopic: x\nstatement: s\nfiles: [a.py]\n"
        "reference: {a.py: 'x = 1'}\ntests: {test_a.py: 'import a'}\n"
    )
    with pytest.raises(ProblemError, match=r"bad.yaml: id: 'Bad_Id' is not kebab-case"):
        load_problem(path)
    path.write_text(path.read_text().replace("Bad_Id", "ok").replace("x = 1", "def (:"))
    with pytest.raises(ProblemError, match=r"reference.a.py: does not parse"):
        load_problem(path)


HOSTILE = {
    "edits_the_tests": """
import os
for folder in ("tests", "."):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "test_lru.py"), "w") as f:
        f.write("import unittest\\nclass T(unittest.TestCase):\\n    def test_ok(self):\\n        pass\\n")
class LRUCache:
    def __init__(self, capacity): pass
""",
    "exits_zero_at_import": "import sys\nsys.exit(0)\n",
    "loops_forever_at_import": "while True:\n    pass\n",
    "kills_itself_at_import": "import os\nos._exit(0)\n",
    "exits_zero_in_a_method": """
import os
class LRUCache:
    def __init__(self, capacity):
        os._exit(0)
""",
    "patches_unittest": """
import unittest, builtins
unittest.TestCase.assertEqual = lambda *a, **k: None
unittest.TestCase.assertTrue = lambda *a, **k: None
unittest.TestResult.wasSuccessful = lambda self: True
unittest.TestCase.run = lambda self, result=None: None
builtins.AssertionError = type("AssertionError", (Exception,), {})
class LRUCache:
    def __init__(self, capacity): pass
""",
    "always_equal": """
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __len__(self): return 0
    def __iter__(self): return iter([])
    def __contains__(self, item): return True
class LRUCache:
    def __init__(self, capacity): pass
    def __getattr__(self, name): return lambda *a, **k: Anything()
    def __len__(self): return 0
    def __contains__(self, key): return True
""",
    "int_subclass_that_equals_anything": """
class Sly(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
class LRUCache:
    def __init__(self, capacity): pass
    def __getattr__(self, name): return lambda *a, **k: Sly(0)
""",
    "swallows_assertions": """
class LRUCache:
    def __init__(self, capacity): pass
    def __enter__(self): return self
    def __exit__(self, *exc): return True
""",
    "forges_answers_on_its_pipes": """
import marshal, os, struct
for fd in range(3, 64):
    try:
        payload = marshal.dumps((1, ("ok", ("v", True))))
        os.write(fd, struct.pack(">I", len(payload)) + payload)
        os.write(fd, struct.pack(">I", 11) + marshal.dumps(("done",))[:11])
    except OSError:
        pass
class LRUCache:
    def __init__(self, capacity): pass
""",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_candidates_score_zero(verifier, name):
    verdict = score(verifier, {"lru.py": HOSTILE[name]})
    assert verdict.reward == 0.0, verdict.details
    assert verdict.details["tests_passed"] == 0


def test_writes_outside_the_workspace_reach_nothing_outside_the_run(verifier, tmp_path):
    marker = f"rlvr-workspace-escape-{uuid.uuid4().hex}"
    program = f"""
import os
for target in ("/tmp/{marker}", "/{marker}", "../{marker}", "{tmp_path}/{marker}", "/usr/{marker}"):
    try:
        with open(target, "w") as f:
            f.write("x")
    except OSError:
        pass
""" + LRU.reference["lru.py"]
    verdict = score(verifier, {"lru.py": program})
    assert verdict.correct  # its own tmpfs: allowed there, gone after the run
    assert not os.path.exists(f"/tmp/{marker}") and not (tmp_path / marker).exists()
    assert not os.path.exists(f"/{marker}") and not os.path.exists(f"/usr/{marker}")


def test_a_correct_candidate_that_leaves_a_daemon_scores_zero(verifier):
    daemon = """
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
""" + LRU.reference["lru.py"]
    verdict = score(verifier, {"lru.py": daemon})
    assert verdict.reward == 0.0 and verdict.details["leftover_processes"] >= 1
    assert "process(es) running" in verdict.details["reason"]
    assert score(verifier, LRU.reference).correct  # nothing of it outlived its run


def test_system_exit_in_a_method_is_the_candidate_failing_not_the_tests(verifier):
    program = LRU.reference["lru.py"] + "\n\nimport sys\nLRUCache.keys = lambda self: sys.exit(0)\n"
    verdict = score(verifier, {"lru.py": program})
    failing = [t for t in verdict.details["tests"] if not t["passed"]]
    assert failing and all("keys" in t["name"] or "SystemExit" in t["message"] for t in failing)
    assert 0 < verdict.reward < 1


def test_curation_quarantines_a_failing_reference_and_a_bad_file_and_tags_levels(tmp_path):
    import shutil

    from tasks.curation.config import SourceConfig, ValidationConfig
    from tasks.curation.load import load_source
    from tasks.curation.stage import check_code_solutions

    folder = tmp_path / "problems"
    (folder / "file").mkdir(parents=True)
    good = PROBLEMS["ds-union-find"]
    shutil.copy(good.path, folder / "file" / "a-good.yaml")
    broken = Path(good.path).read_text().replace(f"id: {good.id}", "id: broken-reference")
    broken = broken.replace("class UnionFind", "class NotUnionFind", 1).replace(
        "statement: |\n", "statement: |\n  Variant.\n", 1
    )
    (folder / "file" / "b-broken.yaml").write_text(broken)
    (folder / "file" / "c-bad.yaml").write_text("id: c-bad\nlevel: file\n")
    source = SourceConfig(kind="workspaces", path=str(folder), name="mine")
    loaded = check_code_solutions(load_source(source, ValidationConfig()), ValidationConfig())
    assert loaded.problems["prompt"].str.contains("```python unionfind.py|```python").all()
    assert loaded.problems.height == 1 and loaded.problems["verifier"].to_list() == ["workspace"]
    assert json.loads(loaded.problems["metadata"][0])["code_level"] == "file"
    reasons = dict(zip(loaded.quarantined["source_uri"].to_list(), loaded.quarantined["reason"].to_list()))
    assert any(
        "b-broken.yaml" in uri and "reference solution fails its own tests" in reason for uri, reason in reasons.items()
    )
    assert loaded.quarantined.filter(pl.col("reason").str.contains("c-bad.yaml"))["field"].to_list() == ["difficulty"]


def test_the_generated_family_is_seeded_and_its_references_pass_and_wrongs_fail(verifier):
    from tasks.workspaces.generate import generate_problems, simulate

    first, again = generate_problems("bounded_buffer", 6, seed=3), generate_problems("bounded_buffer", 6, seed=3)
    assert [p.tests for _, p in first] == [p.tests for _, p in again]
    assert generate_problems("bounded_buffer", 1, seed=4)[0][1].tests != first[0][1].tests
    assert simulate("stack", 2, "drop_oldest", [("push", 1), ("push", 2), ("push", 3), ("items",), ("pop",)]) == [
        True,
        True,
        True,
        [3, 2],
        3,
    ]
    assert simulate("queue", 1, "reject", [("push", 1), ("push", 2), ("pop",), ("pop",)]) == [
        True,
        False,
        1,
        "IndexError",
    ]
    for _, problem in first:
        assert verifier.run(problem.spec(), problem.reference).correct, problem.id
        for wrong in problem.wrong:
            assert not verifier.run(problem.spec(), wrong.files).correct, (problem.id, wrong.why)


def test_sql_views_per_code_level_and_per_failing_test(verifier, tmp_path):
    from storage.catalog import open_catalog
    from storage.lake import Lake
    from storage.runs import Run
    from tasks.curation.config import SourceConfig, ValidationConfig
    from tasks.curation.load import load_source
    from tasks.workspaces.generate import generate_problems

    lake, run = Lake.open(str(tmp_path / "lake")), Run(flow="test", stage="test", parameters={})
    loaded = load_source(
        SourceConfig(kind="workspaces", generator="bounded_buffer", count=2, name="g"), ValidationConfig()
    )
    lake.append(
        "problems",
        loaded.problems.drop("similarity_checks").with_columns(
            bank_version=pl.lit(1, pl.Int64), run_id=pl.lit(run.run_id)
        ),
        run,
    )
    rows = []
    for problem in loaded.problems.iter_rows(named=True):
        spec = json.loads(problem["tests"])
        wrong = (
            next(p for _, p in generate_problems("bounded_buffer", 2, 0) if p.prompt() == problem["prompt"])
            .wrong[0]
            .files
        )
        for index, files in enumerate([json.loads(problem["solution"]), wrong]):
            verdict = verifier.run(spec, files)
            rows.append(
                {
                    "iteration": 1,
                    "rollout_id": f"{problem['problem_id']}-{index}",
                    "problem_id": problem["problem_id"],
                    "verifier": "workspace",
                    "verifier_version": "1.0",
                    "reward": verdict.reward,
                    "correct": verdict.correct,
                    "details": json.dumps(verdict.details),
                    "run_id": run.run_id,
                }
            )
    lake.append("rewards", pl.DataFrame(rows), run)
    catalog = open_catalog(lake)
    by_level = catalog.sql("select * from code_solve_rate_by_code_level").pl()
    assert by_level.select("code_level", "rollouts", "solve_rate").to_dicts() == [
        {"code_level": "file", "rollouts": 4, "solve_rate": 0.5}
    ]
    failing = catalog.sql("select * from failing_tests where failures > 0").pl()
    assert failing.height >= 2 and (failing["runs"] == 2).all() and (failing["failure_rate"] == 0.5).all()
    assert failing["test"].str.contains("::").all()


def test_curating_workspaces_decontaminates_against_a_code_eval_set(cli, tmp_path):
    project = PROBLEMS["proj-markdown"]
    eval_file = tmp_path / "heldout.jsonl"  # a HumanEval-layout evaluation set quoting one statement
    eval_file.write_text(
        json.dumps(
            {
                "task_id": "x/0",
                "prompt": f'def render(text):\n    """{project.prompt()}"""\n',
                "canonical_solution": "    return text\n",
                "entry_point": "render",
                "test": "def check(candidate):\n    assert candidate('a') == 'a'\n",
            }
        )
        + "\n"
    )
    config = tmp_path / "bank.yaml"
    config.write_text(
        f"bank:\n  sources:\n    - {{kind: workspaces, code_level: project, name: projects}}\n"
        f"    - {{kind: humaneval, path: {eval_file}, name: heldout, split: eval}}\n"
    )
    lake = str(tmp_path / "lake")
    result = cli("curate", "--config", str(config), "--lake", lake)
    assert result.returncode == 0, result.stderr
    dropped = cli(
        "sql", "select reason, count(*) n from dropped_problems group by 1", "--lake", lake, "--format", "csv"
    )
    assert "contaminated,1" in dropped.stdout
    levels = cli(
        "sql",
        "select json_extract_string(metadata, '$.code_level') as code_level, count(*) n from problems "
        "where source = 'projects' group by 1",
        "--lake",
        lake,
        "--format",
        "csv",
    )
    assert "project,4" in levels.stdout


def test_verify_file_scores_workspace_lines(tmp_path):
    from conftest import run_cli

    lines = [
        {
            "id": 1,
            "domain": "code",
            "verifier": "workspace",
            "tests": json.dumps(LRU.spec()),
            "response": f"```python lru.py\n{LRU.reference['lru.py']}```",
        },
        {
            "id": 2,
            "domain": "code",
            "verifier": "workspace",
            "tests": json.dumps(LRU.spec()),
            "response": "```python lru.py\nclass LRUCache:\n    pass\n```",
        },
    ]
    source, scored = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run_cli("verify-file", str(source), str(scored), "--workers", "1", "--partial-credit", "half")
    assert result.returncode == 0, result.stderr
    rewards = [json.loads(line)["reward"] for line in scored.read_text().splitlines()]
    assert rewards == [1.0, 0.0]


def test_process_a_answers_calls_itself_when_no_thread_can_start(monkeypatch):
    """A's user id may hold its whole process limit (RLIMIT_NPROC counts threads, and another run under
    that id can use it up): A then answers each call on its reading thread instead of dying."""
    import threading

    from tasks.sandbox import proxies, remote

    to_a, from_b = os.pipe()
    to_b, from_a = os.pipe()
    connection = proxies.Connection(from_b, to_b)  # B's reading thread starts before the limit bites
    workspace = remote.Workspace(to_a, from_a)
    serving = threading.Thread(target=workspace.serve, daemon=True)
    serving.start()

    def refused(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    connection.deadline = time.monotonic() + 20
    json_module = connection.request("import", "json")
    assert json_module.dumps([1, 2]) == "[1, 2]"
    assert workspace.threads == 0  # every call was answered by serve itself
    monkeypatch.undo()
    os.close(from_b)  # B hangs up: A's serve reads the end and returns
    serving.join(10)
    os.close(from_a)  # A's end closes: B's reader sees it and stops
    for _ in range(100):
        if connection.gone:
            break
        time.sleep(0.05)
    assert not serving.is_alive() and connection.gone
    os.close(to_a)
    os.close(to_b)
