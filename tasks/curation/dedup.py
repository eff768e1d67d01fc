"""Near-duplicate detection (MinHash LSH) and n-gram decontamination, vectorised with NumPy.

Everything is linear in the number of word n-grams: shingles are hashed in one pass over a
flat token array, signatures are per-document minima (`np.minimum.reduceat`), and each LSH
bucket links its members to its first member (a star, not all pairs), so a bucket of
thousands of templated problems costs thousands of comparisons, not millions.

Documents are given in priority order: index 0 is kept over index 1 when they are duplicates
(the lake passes problems already in the bank first, then evaluation sets, then new rows).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from hashlib import blake2b

import numpy as np

from tasks.curation.records import normalise_text

TOKEN = re.compile(r"\w+|[^\w\s]")
_PAD = "\x00pad"
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_ROLL = np.uint64(0x100000001B3)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a cheap, well-mixed 64-bit hash of each element."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def shingles(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every word n-gram of every text: (document index, hash), documents in order.

    A text shorter than n words is padded to exactly one n-gram, so every document has one.
    Tokens get ids from a vocabulary, and each distinct token is hashed once with BLAKE2b, so
    the result is the same in every process (Python's `hash` is salted per process, which made
    borderline pairs flip between runs).
    """
    vocabulary: dict[str, int] = {}
    token_ids: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for index, text in enumerate(texts):
        tokens = TOKEN.findall(normalise_text(text))
        if len(tokens) < n:
            tokens += [_PAD] * (n - len(tokens))
        token_ids.extend([vocabulary.setdefault(token, len(vocabulary)) for token in tokens])
        lengths[index] = len(tokens)
    hash_of_id = np.array(
        [int.from_bytes(blake2b(token.encode(), digest_size=8).digest(), "little") for token in vocabulary],
        dtype=np.uint64,
    )
    tokens_flat = hash_of_id[np.array(token_ids, dtype=np.int64)]
    document_of_token = np.repeat(np.arange(len(texts)), lengths)
    count = len(tokens_flat) - n + 1
    if count <= 0:
        return np.empty(0, np.int64), np.empty(0, np.uint64)
    grams = np.zeros(count, dtype=np.uint64)
    for offset in range(n):  # polynomial rolling hash over n tokens
        grams = grams * _ROLL + tokens_flat[offset : offset + count]
    inside = document_of_token[:count] == document_of_token[n - 1 :]  # drop n-grams spanning two texts
    return document_of_token[:count][inside], mix64(grams[inside])


def minhash(documents: np.ndarray, hashes: np.ndarray, n_documents: int, num_perm: int, seed: int = 1) -> np.ndarray:
    """MinHash signatures [n_documents, num_perm]; `documents` must be sorted and cover every document."""
    salts = np.random.default_rng(seed).integers(0, 2**63, size=num_perm, dtype=np.uint64)
    starts = np.searchsorted(documents, np.arange(n_documents))
    signatures = np.empty((n_documents, num_perm), dtype=np.uint64)
    for first in range(0, num_perm, 8):  # 8 permutations at a time bounds memory
        block = mix64(hashes[:, None] ^ salts[None, first : first + 8])
        signatures[:, first : first + 8] = np.minimum.reduceat(block, starts, axis=0)
    return signatures


def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) minimising false positives plus false negatives around the threshold."""
    similarity = np.linspace(0, 1, 201)
    best, best_error = (1, num_perm), np.inf
    for bands in range(1, num_perm + 1):
        rows = num_perm // bands
        caught = 1 - (1 - similarity**rows) ** bands
        false_positive = np.trapezoid(np.where(similarity < threshold, caught, 0), similarity)
        false_negative = np.trapezoid(np.where(similarity >= threshold, 1 - caught, 0), similarity)
        if false_positive + false_negative < best_error:
            best, best_error = (bands, rows), false_positive + false_negative
    return best


@dataclass(frozen=True)
class NearDuplicates:
    duplicate_of: np.ndarray  # [N] index of the kept document this one duplicates, -1 if none
    similarity: np.ndarray  # [N] estimated Jaccard similarity to that document (NaN if none)


# Signatures computed before, by (n-gram, permutations, seed, the text's digest): the bank's texts are screened
# again at every self-play iteration and curation of a long-lived process, and a text's signature never changes.
SIGNATURES_KEPT = 50_000  # about 1 KB each at 128 permutations
_SIGNATURES: OrderedDict[tuple, np.ndarray] = OrderedDict()
_SIGNATURES_LOCK = threading.Lock()


def forget_signatures() -> None:
    """Empty the signature cache: what a fresh process screens with (the dedup benchmark times both)."""
    with _SIGNATURES_LOCK:
        _SIGNATURES.clear()


def signatures_of(texts: list[str], ngram: int, num_perm: int, seed: int) -> np.ndarray:
    """`minhash(*shingles(texts, ngram), ...)`, the same rows, computed only for texts not seen before."""
    keys = [(ngram, num_perm, seed, blake2b(text.encode(), digest_size=16).digest()) for text in texts]
    with _SIGNATURES_LOCK:
        known = [_SIGNATURES.get(key) for key in keys]
    missing = [index for index, row in enumerate(known) if row is None]
    signatures = np.empty((len(texts), num_perm), dtype=np.uint64)
    if missing:
        documents, hashes = shingles([texts[index] for index in missing], ngram)
        computed = minhash(documents, hashes, len(missing), num_perm, seed)
        signatures[missing] = computed
        with _SIGNATURES_LOCK:
            for index, row in zip(missing, computed):
                _SIGNATURES[keys[index]] = row
            while len(_SIGNATURES) > SIGNATURES_KEPT:
                _SIGNATURES.popitem(last=False)
    for index, row in enumerate(known):
        if row is not None:
            signatures[index] = row
    return signatures


def near_duplicates(
    texts: list[str], groups: np.ndarray, threshold: float, ngram: int = 5, num_perm: int = 128, seed: int = 1
) -> NearDuplicates:
    """Cluster near-duplicate texts within each group (e.g. split); every cluster keeps its first text."""
    n_documents = len(texts)
    if n_documents == 0:
        return NearDuplicates(np.empty(0, np.int64), np.empty(0))
    signatures = signatures_of(texts, ngram, num_perm, seed)
    bands, rows = lsh_bands(threshold, num_perm)
    group_salt = mix64(np.asarray(groups, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))

    members, firsts = [], []
    for band in range(bands):
        key = group_salt ^ np.uint64(band)
        for column in range(band * rows, (band + 1) * rows):
            key = mix64(key ^ signatures[:, column])
        order = np.argsort(key, kind="stable")  # stable: the first of a bucket has the lowest index
        sorted_key = key[order]
        starts_bucket = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
        first_of_bucket = order[np.maximum.accumulate(np.where(starts_bucket, np.arange(n_documents), 0))]
        members.append(order[~starts_bucket])
        firsts.append(first_of_bucket[~starts_bucket])
    pairs = np.unique(np.stack([np.concatenate(members), np.concatenate(firsts)], axis=1), axis=0)
    if len(pairs):
        estimated = np.concatenate(
            [
                (signatures[chunk[:, 0]] == signatures[chunk[:, 1]]).mean(axis=1)
                for chunk in np.array_split(pairs, max(1, len(pairs) // 50_000))
            ]
        )
        pairs = pairs[estimated >= threshold]
    cluster = _connected_components(n_documents, pairs)
    duplicate_of = np.where(cluster != np.arange(n_documents), cluster, -1)
    similarity = np.full(n_documents, np.nan)
    linked = np.flatnonzero(duplicate_of >= 0)
    if len(linked):
        similarity[linked] = (signatures[linked] == signatures[duplicate_of[linked]]).mean(axis=1)
    return NearDuplicates(duplicate_of, similarity)


def _connected_components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Label of each node = the smallest index in its component (min-label propagation with pointer jumping)."""
    label = np.arange(n)
    if len(pairs) == 0:
        return label
    left, right = pairs[:, 0], pairs[:, 1]
    while True:
        smallest = np.minimum(label[left], label[right])
        updated = label.copy()
        np.minimum.at(updated, left, smallest)
        np.minimum.at(updated, right, smallest)
        updated = updated[updated]
        if np.array_equal(updated, label):
            return label
        label = updated


def ngram_overlap(texts: list[str], reference_texts: list[str], n: int) -> np.ndarray:
    """For each text, the share of its word n-grams that also occur in the reference texts."""
    if not texts:
        return np.empty(0)
    documents, hashes = shingles(texts, n)
    _, reference = shingles(reference_texts, n)
    hits = np.isin(hashes, np.unique(reference))
    totals = np.bincount(documents, minlength=len(texts))
    return np.bincount(documents, weights=hits, minlength=len(texts)) / np.maximum(totals, 1)
