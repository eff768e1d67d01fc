"""`rlvr verify-file`: every domain, bad lines reported by number, order kept, a hard bound per item."""

import json

import reasoning_gym

from conftest import run_cli
from tasks.verifiers.engine import VerifierPool


def write_lines(path, lines):
    path.write_text("".join((json.dumps(l) if isinstance(l, dict) else l) + "\n" for l in lines))


def test_every_domain_and_bad_lines(tmp_path):
    entry = reasoning_gym.create_dataset("propositional_logic", size=1, seed=3)[0]
    lines = [
        {"id": 1, "domain": "math", "ground_truth": "0.5", "response": r"so \boxed{\frac{1}{2}}"},
        {"id": "two", "domain": "math", "ground_truth": "18", "response": "#### 17"},
        "{not json",
        {"id": 4, "domain": "code", "tests": "assert add(1, 2) == 3\nassert add(2, 2) == 4", "entry_point": "add",
         "response": "```python\ndef add(a, b):\n    return a + b\n```"},
        {"id": 5, "domain": "qa", "ground_truth": "Paris", "response": "The answer is Paris."},
        {"id": 6, "domain": "chemistry", "response": "x"},
        {"id": 7, "domain": "logic", "ground_truth": entry["answer"], "metadata": entry["metadata"],
         "response": f"<answer>{entry['metadata']['example_answer']}</answer>"},
        {"id": 8, "domain": "code", "entry_point": "add", "response": "def add(a, b): return 0"},
        {"id": 9, "domain": "logic", "ground_truth": "x", "response": "<answer>x</answer>"},
        {"id": 10, "domain": "logic", "ground_truth": None, "metadata": entry["metadata"], "response": "<answer>P</answer>"},
        {"id": 11, "domain": "math", "ground_truth": "1", "response": "1", "verifier": "bogus"},
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(source, lines)
    result = run_cli("verify-file", str(source), str(target), "--workers", "2")
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(o["id"], o["reward"], o["correct"], o["verifier"]) for o in out[:5]] == [
        (1, 1.0, True, "math"), ("two", 0.0, False, "math"), (4, 1.0, True, "code"), (5, 1.0, True, "qa"),
        (7, 1.0, True, "gym")]
    assert out[5]["id"] == 10 and out[5]["reward"] < 1.0 and out[5]["correct"] is False   # the dataset's own partial score
    assert all(o["verifier_version"] == "1.0" for o in out)
    assert out[2]["details"]["tests_passed"] == 2 and out[0]["details"]["format_reward"] == 1.0
    assert "line 3: invalid JSON" in result.stderr
    assert "line 6: domain: 'chemistry' is not one of" in result.stderr
    assert "line 8: tests: required for code" in result.stderr
    assert "line 9: metadata:" in result.stderr
    assert "line 11: verifier: unknown verifier 'bogus'" in result.stderr
    assert "5 bad lines skipped" in result.stdout


def test_a_verifier_override_and_options(tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(source, [{"id": i, "domain": "math", "ground_truth": "1", "response": r"\boxed{1}"} for i in range(3)])
    run_cli("verify-file", str(source), str(target), "--verifier", "flipped", "--workers", "0")
    assert [json.loads(line)["reward"] for line in target.read_text().splitlines()] == [0.0, 0.0, 0.0]


def test_one_pathological_item_does_not_stall_the_others():
    slow = ({"domain": "code", "tests": "assert f(1) == 2", "entry_point": "f", "prompt": ""},
            "import time\ndef f(x):\n    time.sleep(60)\n", None)
    quick = [({"domain": "math", "answer": str(i)}, f"\\boxed{{{i}}}", None) for i in range(6)]
    pool = VerifierPool(workers=2, item_timeout=3)
    results = {r.index: r for r in pool.score([slow, *quick])}
    assert results[0].reward == 0.0 and "timed out after 3 s" in results[0].details["reason"]
    assert all(results[i].reward == 1.0 for i in range(1, 7))
