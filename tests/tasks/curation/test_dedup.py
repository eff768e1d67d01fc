"""Near-duplicate detection, exact deduplication over frames, and decontamination."""

import os
import subprocess
import sys

import numpy as np
from helpers import candidates

from tasks.curation import dedup
from tasks.curation.config import DecontaminationConfig, DedupConfig
from tasks.curation.dedup import _connected_components, lsh_bands, near_duplicates, ngram_overlap, shingles
from tasks.curation.filter import decontaminate, deduplicate

STORY = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
    "How much in dollars does she make every day at the farmers' market?"
)


def test_reworded_copy_is_found_and_different_problems_are_not():
    texts = [
        STORY,
        STORY.replace("every morning", "each morning"),  # one word changed
        "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
        STORY.upper(),  # case only
    ]
    found = near_duplicates(texts, np.zeros(4, dtype=np.int64), threshold=0.7)
    assert found.duplicate_of.tolist() == [-1, 0, -1, 0]
    assert found.similarity[1] >= 0.7 and np.isnan(found.similarity[2])


def test_groups_are_never_linked():
    found = near_duplicates([STORY, STORY], np.array([0, 1]), threshold=0.8)
    assert found.duplicate_of.tolist() == [-1, -1]


def test_lsh_band_choice_fits_the_permutations():
    bands, rows = lsh_bands(0.8, 128)
    assert bands * rows <= 128
    # the S-curve crosses one half near the threshold
    assert abs((1 / bands) ** (1 / rows) - 0.8) < 0.1


def test_components_take_the_smallest_index():
    labels = _connected_components(6, np.array([[4, 2], [2, 5], [1, 3]]))
    assert labels.tolist() == [0, 1, 2, 1, 2, 2]


def test_ngram_overlap_share():
    overlap = ngram_overlap(["a b c d e", "x y z w v"], ["q a b c d e q"], 3)
    assert overlap.tolist() == [1.0, 0.0]


def existing(rows):
    frame = candidates(rows)
    return frame.select("problem_id", "source", "source_kind", "source_uri", "domain", "split", "prompt")


def test_exact_duplicates_by_normalised_text_keep_the_first():
    new = candidates(
        [
            {"problem_id": "a", "prompt": "What is 2+2?"},
            {"problem_id": "b", "prompt": "  what IS 2+2 ?  "},
            {"problem_id": "c", "prompt": "What is 3+3?"},
        ]
    )
    kept, dropped = deduplicate(new, existing([]), DedupConfig(near=False))
    assert kept["problem_id"].to_list() == ["a", "c"]
    assert dropped.select("problem_id", "reason", "duplicate_of", "source_line").rows() == [
        ("b", "exact_duplicate", "a", 2)
    ]


def test_the_bank_is_never_dropped_and_wins_over_new_rows():
    bank = existing([{"problem_id": "old", "prompt": STORY}])
    new = candidates(
        [
            {"problem_id": "new", "prompt": STORY.replace("every morning", "each morning")},
            {"problem_id": "other", "prompt": "Something else entirely, about trains and hours."},
        ]
    )
    kept, dropped = deduplicate(new, bank, DedupConfig(threshold=0.7))
    assert kept["problem_id"].to_list() == ["other"]
    assert dropped.select("problem_id", "reason", "duplicate_of").rows() == [("new", "near_duplicate", "old")]


def test_a_training_copy_of_an_eval_problem_is_dropped_as_contaminated():
    new = candidates(
        [
            {"problem_id": "train", "prompt": STORY, "split": "train"},
            {"problem_id": "eval", "prompt": STORY, "split": "eval", "source": "gsm8k-test"},
        ]
    )
    kept, dropped = deduplicate(new, existing([]), DedupConfig())
    assert kept["problem_id"].to_list() == ["train", "eval"] and dropped.height == 0
    kept, dropped = decontaminate(kept, {"gsm8k-test": [STORY]}, DecontaminationConfig())
    assert kept["problem_id"].to_list() == ["eval"]
    assert dropped.select("problem_id", "reason", "duplicate_of").rows() == [("train", "contaminated", "gsm8k-test")]


def test_identical_problems_are_dropped_even_without_exact_dedup():
    new = candidates(
        [{"problem_id": "same", "prompt": "What is 2+2?"}, {"problem_id": "same", "prompt": "What is 2+2?"}]
    )
    kept, dropped = deduplicate(new, existing([]), DedupConfig(exact=False, near=False))
    assert kept["problem_id"].to_list() == ["same"] and dropped["reason"].to_list() == ["exact_duplicate"]


def test_training_problems_in_the_bank_are_flagged_when_a_new_eval_set_overlaps_them():
    bank = candidates([{"problem_id": "old-train", "prompt": STORY, "source": "train-file"}]).select(
        "problem_id", "source", "source_kind", "source_uri", "source_line", "seed", "domain", "split", "prompt"
    )
    new = candidates([{"problem_id": "new-eval", "prompt": STORY, "split": "eval", "source": "late-eval"}])
    kept, dropped = decontaminate(new, {"late-eval": [STORY]}, DecontaminationConfig(), existing=bank)
    assert kept["problem_id"].to_list() == ["new-eval"]
    assert dropped.select("problem_id", "reason", "duplicate_of").rows() == [
        ("old-train", "contaminated_later", "late-eval")
    ]


def test_procedural_rows_skip_similarity_checks_but_not_exact_ones():
    template = "How many ordered pairs of positive integers (a, b) satisfy lcm(a, b) = {}?"
    new = candidates(
        [
            {"problem_id": str(i), "prompt": template.format(n), "similarity_checks": False}
            for i, n in enumerate([240737, 394875, 5324, 5324])
        ]
    )
    kept, dropped = deduplicate(new, existing([]), DedupConfig(threshold=0.5))
    assert kept["problem_id"].to_list() == ["0", "1", "2"]
    assert dropped["reason"].to_list() == ["exact_duplicate"]


def test_decontamination_drops_training_rows_overlapping_an_eval_set():
    new = candidates(
        [
            {"problem_id": "leak", "prompt": STORY.replace("$2", "$3")},
            {"problem_id": "clean", "prompt": "A robe takes 2 bolts of blue fiber and half that much white."},
            {"problem_id": "generated", "prompt": STORY, "similarity_checks": False},
        ]
    )
    kept, dropped = decontaminate(new, {"gsm8k-test": [STORY]}, DecontaminationConfig(ngram=8, min_overlap=0.5))
    assert kept["problem_id"].to_list() == ["clean", "generated"]
    assert dropped.select("problem_id", "reason", "duplicate_of").rows() == [("leak", "contaminated", "gsm8k-test")]
    assert dropped["similarity"][0] >= 0.5


def test_decontamination_can_be_disabled():
    new = candidates([{"problem_id": "leak", "prompt": STORY}])
    kept, dropped = decontaminate(new, {"eval": [STORY]}, DecontaminationConfig(enabled=False))
    assert kept.height == 1 and dropped.height == 0


def test_shingle_hashes_are_the_same_in_every_process():
    """Python's string hash is salted per process; ours must not be, or borderline pairs flip."""
    script = (
        "from tasks.curation.dedup import shingles; "
        "print(shingles(['a cat sat on the mat today', 'two words'], 3)[1].tolist())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(shingles(["a cat sat on the mat today", "two words"], 3)[1].tolist())


def test_signatures_are_computed_once_per_text_and_equal_a_fresh_computation(monkeypatch):
    """The bank's texts are screened again at every self-play iteration: a text's MinHash signature is kept and
    only new texts are hashed, with the same rows as hashing them all afresh, in any order."""
    monkeypatch.setattr(dedup, "_SIGNATURES", dedup.OrderedDict())
    texts = [f"Tom has {i} apples and buys {i + 3} more at the market." for i in range(40)]
    documents, hashes = dedup.shingles(texts, 5)
    fresh = dedup.minhash(documents, hashes, len(texts), 64, 1)
    computed = []
    real = dedup.minhash
    monkeypatch.setattr(dedup, "minhash", lambda d, h, n, *rest: computed.append(n) or real(d, h, n, *rest))
    assert (dedup.signatures_of(texts, 5, 64, 1) == fresh).all()
    shuffled = texts[20:] + ["A brand new problem about trains leaving two stations."] + texts[:20]
    again = dedup.signatures_of(shuffled, 5, 64, 1)
    assert computed == [40, 1]  # the second call hashed the one new text
    assert (again[:20] == fresh[20:]).all() and (again[21:] == fresh[:20]).all()
    assert (dedup.signatures_of(texts, 5, 32, 1) != 0).any() and computed == [40, 1, 40]  # another setting: anew


def test_the_dedup_benchmark_times_cold_screens_and_the_warm_one_apart(monkeypatch):
    """Each timed repeat computes every signature (the cache is emptied first), the warm screen none: a
    benchmark that timed cache hits once reported 0.17 s at 50,000 problems and ×13.6 per doubling."""
    from bench import dedup_scaling
    from tasks.curation import dedup

    computed = []
    real = dedup.minhash
    monkeypatch.setattr(
        dedup,
        "minhash",
        lambda documents, hashes, count, *rest: computed.append(count) or real(documents, hashes, count, *rest),
    )
    texts = [f"what is {a} plus {a + 1}, twice over" for a in range(40)]
    _, found, _ = dedup_scaling.time_near_duplicates(texts, repeats=3)
    assert computed == [40, 40, 40] and found >= 0  # three cold screens, the warm one from the cache
    assert not dedup._SIGNATURES  # and nothing left behind for the next size
