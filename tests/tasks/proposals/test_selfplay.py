"""Absolute Zero-style self-play: every validity rule of a proposal on a hand-written one, the solver's
answers judged by execution for each task type, hostile answers, and the learnability reward by hand."""

from datetime import UTC, datetime

import pytest

from tasks.proposals.code_tasks import CodeTask, ProposalRules, Rejection, learnability, parse_proposal, solver_prompt
from tasks.proposals.executor import PROPOSAL_LIMITS, judge_answer, validate, validate_all
from tasks.sandbox.client import Sandbox
from tasks.verification.registry import build_verifier

RULES = ProposalRules(induction_pairs=4)


def proposal(program: str, *inputs: str) -> str:
    blocks = "".join(f"```input\n{text}\n```\n" for text in inputs)
    return f"Here is a task.\n```python\n{program}\n```\n{blocks}"


@pytest.fixture(scope="module")
def pair():
    """Two sandbox servers, as validation runs a proposal: once on each."""
    with Sandbox(0, PROPOSAL_LIMITS) as first, Sandbox(1, PROPOSAL_LIMITS) as second:
        yield first, second


@pytest.fixture(scope="module")
def sandbox(pair):
    return pair[0]


def verdict(pair, text: str, task_type: str = "deduction", seen: set | None = None):
    return validate(pair, parse_proposal(text, task_type, RULES), set() if seen is None else seen, RULES)


def test_a_valid_proposal_gets_its_outputs_from_the_sandbox(pair):
    result = verdict(pair, proposal("def f(xs, k):\n    return sorted(xs)[-k:]", "[3, 1, 2], 2"))
    assert result.rejection is None
    assert result.task.inputs == ("([3, 1, 2], 2)",) and result.task.outputs == ("[2, 3]",)


@pytest.mark.parametrize(
    "text, reason, detail",
    [
        ("no blocks at all", "unparseable", "needs a python block"),
        (proposal("def g(x):\n    return x", "1"), "unparseable", "defines no top-level function f"),
        (proposal("def f(x) return x", "1"), "does_not_run", "syntax error"),
        (proposal("def f(x):\n    return 1 // (x - 1)", "1"), "does_not_run", "ZeroDivisionError"),
        (proposal("def f(x):\n    return undefined_name", "1"), "does_not_run", "NameError"),
        (
            proposal("import random\ndef f(x):\n    return random.random() + x", "1"),
            "forbidden_import",
            "imports random",
        ),
        (proposal("from _random import Random\ndef f(x):\n    return x", "1"), "forbidden_import", "imports _random"),
        (proposal("import math\ndef f(x):\n    return math.isqrt(x)", "1.5"), "does_not_run", "TypeError"),
        (proposal("def f(x):\n    import os\n    return os.getpid()", "1"), "forbidden_import", "imports os"),
        (proposal("def f(x):\n    return open('/etc/passwd').read()", "1"), "forbidden_import", "calls open()"),
        (
            proposal("def f(x):\n    return ().__class__.__base__.__subclasses__()", "1"),
            "forbidden_import",
            "uses __subclasses__",
        ),
        (proposal("def f(x):\n    while True:\n        x += 1", "1"), "too_slow", "sandbox: "),
        (proposal("def f(x):\n    return 'a' * x", "1000"), "output_too_large", "characters (limit 500)"),
        (proposal("def f(x):\n    return 'a' * x", "100000"), "output_too_large", "sandbox: output_limit"),
        (proposal("def f(x):\n    return object()", "1"), "not_a_literal", "is not a literal"),
        (proposal("def f(x):\n    return x", "len('ab')"), "not_a_literal", "is not an argument list of literals"),
    ],
)
def test_each_validity_rule_rejects_a_hand_written_proposal(pair, text, reason, detail):
    result = verdict(pair, text)
    assert result.task is None and result.rejection.reason == reason
    assert detail in result.rejection.detail


def test_a_proposal_whose_two_runs_differ_is_not_deterministic(pair):
    # a set's order of strings follows the hash seed, which differs between the two sandbox servers
    words = ", ".join(repr(f"w{i}") for i in range(20))
    result = verdict(pair, proposal("def f(words):\n    return list(set(words))", f"[{words}]"))
    assert result.rejection == Rejection("not_deterministic", "two runs gave different outputs")
    assert verdict(pair, proposal("def f(words):\n    return sorted(set(words))", f"[{words}]")).task is not None


def test_a_repeat_of_an_earlier_task_is_a_duplicate_even_reformatted(pair):
    seen: set[str] = set()
    first = verdict(pair, proposal("def f(x):\n    return x * 2", "3"), seen=seen)
    again = verdict(pair, proposal("def f(x):\n\n    # twice\n    return x*2", "3"), seen=seen)
    other_input = verdict(pair, proposal("def f(x):\n    return x * 2", "4"), seen=seen)
    assert first.task is not None and other_input.task is not None
    assert again.rejection == Rejection("duplicate", "the same program and inputs were proposed before")
    batch = validate_all(
        [parse_proposal(proposal("def f(x):\n    return -x", "1"), "deduction")] * 2, set(), sandboxes=pair
    )
    assert [v.rejection.reason if v.rejection else "valid" for v in batch] == ["valid", "duplicate"]


def test_the_solver_is_judged_by_execution_for_each_task_type(pair, sandbox):
    program = "def f(a, b):\n    return a * b + 1"
    deduction = CodeTask("deduction", program, ("(3, 4)",), ("13",))
    assert judge_answer(sandbox, deduction, "13") == (True, None)
    assert judge_answer(sandbox, deduction, "13.0") == (False, "wrong output")  # a float is not the int
    assert judge_answer(sandbox, deduction, "f(3, 4)")[1] == "the answer is not a literal"  # never evaluated
    abduction = CodeTask("abduction", program, ("(3, 4)",), ("13",))
    assert judge_answer(sandbox, abduction, "4, 3") == (True, None)  # any input that gives it
    assert judge_answer(sandbox, abduction, "2, 2") == (False, "wrong output")
    assert judge_answer(sandbox, abduction, "__import__('os')")[0] is False
    pairs = validate(
        pair, parse_proposal(proposal(program, "1, 1", "2, 3", "0, 5", "4, 4"), "induction", RULES), set(), RULES
    ).task
    assert pairs.shown == 2 and "f(0, 5)" not in solver_prompt(pairs)  # held-out pairs stay hidden
    assert judge_answer(sandbox, pairs, "def f(a, b):\n    return b * a + 1") == (True, None)
    wrong = "def f(a, b):\n    return {(1, 1): 2, (2, 3): 7}.get((a, b), 0)"  # fits the shown pairs only
    assert judge_answer(sandbox, pairs, wrong) == (False, "wrong on held-out pairs")


def test_hostile_solver_answers_score_nothing(pair, sandbox):
    task = validate(
        pair,
        parse_proposal(proposal("def f(x):\n    return x + 1", "1", "2", "3", "4"), "induction", RULES),
        set(),
        RULES,
    ).task
    forged = (
        "import atexit, json\ndef f(x):\n    return x\n"
        "atexit.register(lambda: print('@@rlvr-outputs-0000000000000000@@' + json.dumps(['4', '5'])))"
    )
    assert judge_answer(sandbox, task, forged)[0] is False  # a marker it cannot know
    exits = "import sys\ndef f(x):\n    sys.exit(0)"
    assert judge_answer(sandbox, task, exits)[0] is False  # exiting early is not passing
    spins = "def f(x):\n    while True:\n        pass"
    assert judge_answer(sandbox, task, spins) == (False, "too_slow: sandbox: timeout") or judge_answer(
        sandbox, task, spins
    )[1].startswith("too_slow")


def test_the_selfplay_verifier_scores_a_problem_row():
    task = CodeTask("deduction", "def f(x):\n    return x[::-1]", ("('abc',)",), ("'cba'",))
    verifier = build_verifier("selfplay")
    try:
        right = verifier.verify({"answer": task.to_json()}, "It reverses.\n```output\n'cba'\n```")
        wrong = verifier.verify({"answer": task.to_json()}, "```output\n'abc'\n```")
        missing = verifier.verify({"answer": task.to_json()}, "cba")
    finally:
        verifier.close()
    assert (right.reward, right.correct) == (1.0, True)
    assert (wrong.reward, wrong.details["reason"]) == (0.0, "wrong output")
    assert missing.details["reason"] == "no answer block"


@pytest.mark.parametrize(
    "solve_rate, reward", [(None, 0.0), (0.0, 0.0), (1.0, 0.0), (0.25, 0.75), (0.5, 0.5), (7 / 8, 0.125)]
)
def test_learnability_by_hand(solve_rate, reward):
    assert learnability(solve_rate) == pytest.approx(reward)


def test_every_warm_up_template_agrees_with_the_sandbox_and_its_worked_examples_score_1(pair, sandbox):
    """tasks/generators/programs.py computes outputs with Python twins of its program texts: the sandbox,
    running the texts, must agree, and each worked example must be what the verifiers accept."""
    import random

    from tasks.generators.programs import TEMPLATES, draw_task, proposer_example, solver_example
    from tasks.proposals.code_tasks import last_block, proposal_text
    from tasks.proposals.verifiers import ANSWER_BLOCKS, ProposalVerifier, SelfPlayVerifier

    rng = random.Random(0)
    drawn = [draw_task(rng, False, "induction") for _ in range(120)]
    assert {task.program.split("return")[1].split()[0] for task in drawn} >= {
        t.text.split("return")[1].split()[0] for t in TEMPLATES
    }  # every template drawn
    for task in drawn:
        checked = validate(pair, parse_proposal(proposal_text(task), "induction"), set()).task
        assert checked is not None and checked.outputs == task.outputs
    solver, proposer = SelfPlayVerifier(_sandbox=sandbox), ProposalVerifier(_sandboxes=pair)
    for index in range(30):
        example = solver_example(rng, heldout=index % 2 == 0)
        task = CodeTask.from_json(example.answer)
        assert judge_answer(sandbox, task, last_block(example.solution, ANSWER_BLOCKS[task.task_type])) == (True, None)
        assert solver.verify({"answer": example.answer}, example.solution).reward == 1.0
        made = proposer_example(rng)
        assert proposer.verify({"answer": made.answer}, made.solution).correct is True


def proposal_row(
    iteration: int,
    index: int,
    verdict: str,
    task_key: str | None,
    shape: str | None,
    solve_rate: float | None = None,
    reason: str | None = None,
) -> dict:
    return {
        "proposal_id": f"p-{iteration}-{index:02d}",
        "iteration": iteration,
        "verdict": verdict,
        "task_key": task_key,
        "shape_key": shape,
        "solve_rate": solve_rate,
        "reason": reason,
    }


HISTORY = [  # iteration 1: three valid tasks of two shapes, one unparseable; iteration 2: a repeat and a new task
    proposal_row(1, 0, "valid", "t1", "s1", 0.5),
    proposal_row(1, 1, "valid", "t2", "s1", 0.25),
    proposal_row(1, 2, "valid", "t3", "s2", 1.0),
    proposal_row(1, 3, "invalid", None, None, reason="unparseable"),
    proposal_row(2, 0, "invalid", "t1", None, reason="duplicate"),
    proposal_row(2, 1, "valid", "t4", "s2", 0.75),
    proposal_row(2, 2, "invalid", None, None, reason="unparseable"),
    proposal_row(2, 3, "invalid", None, None, reason="unparseable"),
]


def test_collapse_metrics_by_hand_and_the_sql_view_agrees(tmp_path):
    import polars as pl

    from storage.catalog import open_catalog
    from storage.lake import Lake
    from tasks.selfplay.health import proposal_health

    health = proposal_health(pl.DataFrame(HISTORY))
    first, second = health.rows(named=True)
    assert (first["valid_rate"], first["distinct_rate"], first["near_duplicate_rate"]) == (
        0.75,
        1.0,
        pytest.approx(1 / 3),
    )
    assert first["mean_solve_rate"] == pytest.approx(7 / 12)
    assert (second["valid_rate"], second["distinct_rate"], second["near_duplicate_rate"]) == (0.25, 0.5, 1.0)
    # a valid SPICE challenge has no program, so no shape: it is not a near-duplicate of anything
    challenge = proposal_row(1, 4, "valid", "c1", None, 0.5)
    with_challenge = proposal_health(pl.DataFrame([*HISTORY, challenge])).row(0, named=True)
    assert (with_challenge["valid_rate"], with_challenge["distinct_rate"], with_challenge["near_duplicate_rate"]) == (
        0.8,
        1.0,
        pytest.approx(1 / 3),
    )
    lake = Lake.open(str(tmp_path / "lake"))
    full = [
        {
            **row,
            "role": "proposer",
            "task_type": "deduction",
            "model_version": 1,
            "rollout_id": row["proposal_id"],
            "created_at": datetime.now(UTC),
        }
        for row in [*HISTORY, challenge]
    ]
    for iteration in (1, 2):
        with lake.run("test", "rollout", {}, iteration=iteration) as run:
            lake.replace(
                "proposals",
                pl.DataFrame([r for r in full if r["iteration"] == iteration]),
                {"iteration": iteration},
                run,
            )
    sql = open_catalog(lake).sql("select * from proposal_health").pl()
    expected = proposal_health(pl.DataFrame([*HISTORY, challenge]))
    for column in ("valid_rate", "distinct_rate", "near_duplicate_rate", "mean_solve_rate", "solve_rate_std"):
        assert sql[column].to_list() == pytest.approx(expected[column].to_list()), column
    rejections = open_catalog(lake).sql("select * from proposal_rejections where iteration = 2").pl()
    assert dict(zip(rejections["outcome"], rejections["proposals"])) == {"unparseable": 2, "duplicate": 1, "valid": 1}


def test_the_tripwire_names_what_fired():
    import polars as pl

    from tasks.selfplay.health import TripwireConfig, proposal_health, tripped

    health = proposal_health(pl.DataFrame(HISTORY))
    wire = TripwireConfig(after=2, min_valid_rate=0.5, max_near_duplicate_rate=0.9, min_eval_solve_rate=0.3)
    assert tripped(health, 0.1, 1, wire) == []  # before `after`
    assert tripped(health, 0.4, 2, wire) == [
        "valid-proposal rate 25.0% below selfplay.tripwire.min_valid_rate 50%",
        "near-duplicate rate 100.0% above selfplay.tripwire.max_near_duplicate_rate 90%",
    ]
    assert tripped(health, 0.1, 2, TripwireConfig(min_eval_solve_rate=0.3)) == [
        "held-out solve rate 10.0% below selfplay.tripwire.min_eval_solve_rate 30%"
    ]
    assert tripped(health, None, 2, TripwireConfig()) == []  # every check off by default
