"""`rlvr verify-file`: every domain, bad lines reported by number, order kept, a hard bound per item."""

import json

import reasoning_gym
from conftest import run_cli

from tasks.verification.engine import VerifierPool


def write_lines(path, lines):
    path.write_text("".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines))


def test_every_domain_and_bad_lines(tmp_path):
    entry = reasoning_gym.create_dataset("propositional_logic", size=1, seed=3)[0]
    lines = [
        {"id": 1, "domain": "math", "ground_truth": "0.5", "response": r"so \boxed{\frac{1}{2}}"},
        {"id": "two", "domain": "math", "ground_truth": "18", "response": "#### 17"},
        "{not json",
        {
            "id": 4,
            "domain": "code",
            "tests": "assert add(1, 2) == 3\nassert add(2, 2) == 4",
            "entry_point": "add",
            "response": "```python\ndef add(a, b):\n    return a + b\n```",
        },
        {"id": 5, "domain": "qa", "ground_truth": "Paris", "response": "The answer is Paris."},
        {"id": 6, "domain": "chemistry", "response": "x"},
        {
            "id": 7,
            "domain": "logic",
            "ground_truth": entry["answer"],
            "metadata": entry["metadata"],
            "response": f"<answer>{entry['metadata']['example_answer']}</answer>",
        },
        {"id": 8, "domain": "code", "entry_point": "add", "response": "def add(a, b): return 0"},
        {"id": 9, "domain": "logic", "ground_truth": "x", "response": "<answer>x</answer>"},
        {
            "id": 10,
            "domain": "logic",
            "ground_truth": None,
            "metadata": entry["metadata"],
            "response": "<answer>P</answer>",
        },
        {"id": 11, "domain": "math", "ground_truth": "1", "response": "1", "verifier": "bogus"},
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(source, lines)
    result = run_cli("verify-file", str(source), str(target), "--workers", "2")
    assert result.returncode == 3, result.stderr  # some lines skipped, every other one scored
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(o["id"], o["reward"], o["correct"], o["verifier"]) for o in out[:5]] == [
        (1, 1.0, True, "math"),
        ("two", 0.0, False, "math"),
        (4, 1.0, True, "code"),
        (5, 1.0, True, "qa"),
        (7, 1.0, True, "gym"),
    ]
    assert (
        out[5]["id"] == 10 and out[5]["reward"] < 1.0 and out[5]["correct"] is False
    )  # the dataset's own partial score
    assert {o["verifier"]: o["verifier_version"] for o in out} == {
        "math": "2.2",
        "code": "1.1",
        "qa": "1.0",
        "gym": "1.0",
    }
    assert out[2]["details"]["tests_passed"] == 2 and out[0]["details"]["format_reward"] == 1.0
    assert "line 3: invalid JSON" in result.stderr
    assert "line 6: domain: 'chemistry' is not one of" in result.stderr
    assert "line 8: tests: required for code" in result.stderr
    assert "line 9: metadata:" in result.stderr
    assert "line 11: verifier: unknown verifier 'bogus'" in result.stderr
    assert "5 bad lines skipped" in result.stdout


def test_a_verifier_that_serves_one_domain_may_be_given_as_the_domain():
    """Issue 37: `"domain": "translation"` was refused although the translation verifier exists."""
    from tasks.verification.files import BadLine, parse_line

    line = {
        "id": 1,
        "domain": "translation",
        "prompt": "Translate into French: The cat is black.",
        "ground_truth": "Le chat est noir.",
        "response": "Translation: Le chat est noir.",
    }
    problem, response, verifier = parse_line(1, json.dumps(line))
    assert (problem["domain"], verifier) == ("qa", "translation")
    assert next(VerifierPool(workers=0).score([(problem, response, verifier)])).reward == 1.0
    sat = parse_line(2, json.dumps({"id": 2, "domain": "sat", "response": "x", "prompt": "p cnf 1 1\n1 0"}))
    assert sat[0]["domain"] == "logic" and sat[2] == "sat"
    refused = parse_line(3, json.dumps({"id": 3, "domain": "random", "response": "x"}))
    assert isinstance(refused, BadLine) and "the `verifier` field selects any verifier" in refused.reason
    clash = parse_line(4, json.dumps({**line, "verifier": "qa"}))
    assert isinstance(clash, BadLine) and "give the domain, 'qa', with the verifier you want" in clash.reason


def test_a_verifier_override_and_options(tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(source, [{"id": i, "domain": "math", "ground_truth": "1", "response": r"\boxed{1}"} for i in range(3)])
    run_cli("verify-file", str(source), str(target), "--verifier", "flipped", "--workers", "0")
    assert [json.loads(line)["reward"] for line in target.read_text().splitlines()] == [0.0, 0.0, 0.0]


def test_one_pathological_item_does_not_stall_the_others():
    slow = (
        {"domain": "code", "tests": "assert f(1) == 2", "entry_point": "f", "prompt": ""},
        "import time\ndef f(x):\n    time.sleep(60)\n",
        None,
    )
    quick = [({"domain": "math", "answer": str(i)}, f"\\boxed{{{i}}}", None) for i in range(6)]
    pool = VerifierPool(workers=2, item_timeout=3)
    results = {r.index: r for r in pool.score([slow, *quick])}
    assert results[0].reward == 0.0 and "timed out after 3 s" in results[0].details["reason"]
    assert all(results[i].reward == 1.0 for i in range(1, 7))


# ---- hostile inputs: bounded extraction, in-process deadlines, small details, bad lines skipped ----------------
def test_nested_boxes_are_read_in_linear_memory():
    import tracemalloc

    from tasks.verifiers.extract import all_boxed

    response = "\\boxed{" * 200_000 + "1" + "}" * 200_000  # 1.4 MB, 200,000 boxes deep
    tracemalloc.start()
    found = all_boxed(response)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(found) == 1 and found[0].startswith("\\boxed{")  # the outer box; the rule sees the inner
    assert peak < 40 * len(response)  # a copy per level would be ~140 GB
    assert all_boxed(r"\boxed{1} then \fbox{x\boxed{2}} and \boxed{3}") == ["1", r"x\boxed{2}", "3"]


def test_too_long_responses_score_zero_before_any_verifier_reads_them():
    pool = VerifierPool(workers=0, max_response_chars=1000)
    scored = list(
        pool.score(
            [
                ({"domain": "math", "answer": "1"}, "\\boxed{1}" + " " * 2000, None),
                ({"domain": "math", "answer": "1"}, "\\boxed{1}", None),
            ]
        )
    )
    assert scored[0].reward == 0.0 and scored[0].details["reason"] == "too long: 2,009 characters (limit 1,000)"
    assert scored[1].reward == 1.0


def test_scoring_in_process_is_bounded_too():
    """workers: 0 (the demo's setting) used to have no time bound at all."""
    from tasks.verifiers.base import Verdict, register

    @register("test-spin")
    class Spin:
        name, version = "test-spin", "0"

        def verify(self, problem, response):
            while response == "spin":
                pass
            return Verdict(1.0, True, {})

    pool = VerifierPool(workers=0, item_timeout=1)
    first, second = pool.score([({"domain": "math"}, "spin", "test-spin"), ({"domain": "math"}, "fine", "test-spin")])
    assert first.reward == 0.0 and first.details["reason"] == "verification timed out after 1 s"
    assert second.reward == 1.0  # the next item is not disturbed


def test_details_are_capped_whatever_the_response_holds():
    pool = VerifierPool(workers=0)
    huge = "\\boxed{" + "9" * 500_00 + "}"
    (scored,) = pool.score([({"domain": "math", "answer": "1"}, huge, None)])
    assert scored.reward == 0.0 and len(json.dumps(scored.details)) < 4000


def test_bad_lines_are_skipped_never_the_file(tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = json.dumps({"id": 1, "domain": "math", "ground_truth": "2", "response": r"\boxed{2}"}).encode()
    lines = [
        b"\xef\xbb\xbf" + good,  # 1: a byte-order mark, fine
        json.dumps({"id": 2, "domain": "math", "ground_truth": "3", "response": "caf\u00e9"}).encode()[:-3] + b'\xff"}',
        b"[" * 100_000 + b"]" * 100_000,  # 3: nested 100,000 deep
        json.dumps({"id": 4, "domain": "math", "ground_truth": "4", "response": "x", "prompt": 5}).encode(),
        json.dumps({"id": 5, "domain": "math", "ground_truth": "5", "response": "y" * 5000}).encode(),  # 5: too long
        json.dumps({"id": 6, "domain": "code", "tests": 7, "entry_point": "f", "response": "x"}).encode(),
        json.dumps({"id": True, "domain": "math", "ground_truth": "1", "response": "1"}).encode(),
        good.replace(b'"id": 1', b'"id": 8'),
    ]
    source.write_bytes(b"\n".join(lines) + b"\n")
    result = run_cli("verify-file", str(source), str(target), "--workers", "0", "--max-line-bytes", "4000")
    assert result.returncode == 3, result.stderr
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(o["id"], o["reward"]) for o in out] == [(1, 1.0), (8, 1.0)]
    stderr = " ".join(result.stderr.split())
    assert "line 2: not UTF-8 (byte 0xff at column" in stderr
    assert "line 3: longer than 4,000 bytes" in stderr or "line 3: invalid JSON: nested too deeply" in stderr
    assert "line 4: prompt: must be a string, not an integer" in stderr
    assert "line 5: longer than 4,000 bytes" in stderr
    assert "line 6: tests: must be a string, not an integer" in stderr
    assert "line 7: id: missing or not a string or an integer" in stderr
    assert "Traceback" not in result.stderr and "6 bad lines skipped" in result.stdout


def test_deep_json_is_a_bad_line_not_a_traceback(tmp_path):
    from tasks.verification.files import BadLine, read_lines

    source = tmp_path / "in.jsonl"
    source.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (line,) = read_lines(str(source))
    assert isinstance(line, BadLine) and str(line) == "line 1: invalid JSON: nested too deeply"
