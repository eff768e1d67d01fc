"""SPICE-style document-grounded tasks: a challenger reads a document and writes a question, its answer
and the span of the document it rests on; the reasoner then answers the question without the
document. Pure: documents and responses in, tasks or rejections out.

A challenge is three fenced blocks, ```question```, ```answer``` and ```span```. It is valid when the span
is a passage of the document (whitespace aside, cut at word boundaries) and the answer passes SPICE's
challenger filter as far as it is cheap to check (`answer_issue`): a run of whole words of the span (not a
sub-word: "2" is not in "12"), not stop words only or a single letter, not the whole span (the span is the
evidence around the answer), at most `MAX_ANSWER_WORDS` words, a number where the question asks how many, how
much, how long or what year, not in the question, and the question shares a content word with the span; and the
question was not asked before of that document. The challenger's reward is SPICE's: a Gaussian of the variance
of the reasoner's correctness over its G attempts, exp(−(p(1−p) − ¼)² / (2·width)) for solve rate p — 1 at
p = ½ (the variance of a fair coin, ¼), falling off as the task gets too easy or too hard.

A corpus is any user's text: a JSONL file, a text file, or a folder of both; dataset rows (GSM8K's
`question`/`answer`, MATH's `problem`/`solution`, `prompt`/`answer`) become documents of statement and
solution. Each document keeps the file it came from and its licence (a row's `license`, else the SPDX id the
text of the nearest LICENSE, LICENCE or COPYING file is, tasks/proposals/licences.py), so every task grounded in
it can say so.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from tasks.proposals.code_tasks import Rejection
from tasks.proposals.licences import UNKNOWN, licence_of_file
from tasks.verifiers.qa import normalise_answer

BLOCK = re.compile(r"```[ \t]*(question|answer|span)[ \t]*\n(.*?)```", re.DOTALL)
MAX_CHARS = 400
MAX_ANSWER_WORDS = 8  # SPICE's answers are short: a number, a name, a phrase
TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W_]+")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
ARTICLES = frozenset({"a", "an", "the"})
STOP_WORDS = frozenset(
    """a an the and or but if of to in on at by for with from as into onto about than then so
    is are was were be been being am do does did has have had it its this that these those there here he she
    they we you i me him her them us my your his our their what which who whom whose when where why how not no yes
    all any some each every can could will would shall should may might must also only very just""".split()
)
NUMBER_WORDS = frozenset(
    """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred
    thousand million billion dozen half""".split()
)
NUMBER_QUESTION = re.compile(
    r"\b(?:how (?:many|much|long|old|far|tall)|"
    r"(?:what|which) (?:year|number|percentage|percent|amount))\b"
)
# Why a grounded challenge is invalid: the `reason` of its Rejection and of its `proposals` row.
GROUNDED_REASONS = (
    "unparseable",
    "span_not_in_document",
    "answer_not_in_span",
    "trivial_answer",
    "answer_is_span",
    "answer_too_long",
    "answer_not_a_number",
    "answer_in_question",
    "question_not_about_span",
    "duplicate",
)


LICENCE_NAMES = ("LICENSE", "LICENCE", "COPYING")  # any suffix, any case: LICENSE.txt, copying.md
TEXT_SUFFIXES = (".txt", ".md")
DATASET_FIELDS = (
    ("problem", "solution"),
    ("question", "solution"),
    ("question", "answer"),
    ("prompt", "canonical_solution"),
    ("prompt", "solution"),
    ("prompt", "answer"),
)


@dataclass(frozen=True)
class Document:
    document_id: str
    text: str
    source: str | None = None  # the file it came from
    licence: str | None = None  # its licence: a row's own, or an SPDX id read from a licence file (None: none found)

    @property
    def licence_unread(self) -> bool:
        """A licence file is there, but its text is no licence `licences.py` knows (`LicenseRef-unknown (<file>)`)."""
        return (self.licence or "").startswith(UNKNOWN)


@dataclass(frozen=True)
class Challenge:
    question: str
    answer: str
    span: str
    key: str  # what a repeat of the question on the same document shares


def read_documents(path: str | Path) -> list[Document]:
    """A corpus: a JSONL file (one `{"id": ..., "text": ...}` or dataset row per line), a text file
    (paragraphs between blank lines), or a folder of them (read in name order, recursively). Bad lines
    are errors naming the file, the line and the field."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such documents file or folder")
    if path.is_dir():
        files = sorted(
            f
            for f in path.rglob("*")
            if f.is_file()
            and f.suffix.lower() in (".jsonl", *TEXT_SUFFIXES)
            and not is_licence(f)
            and not any(part.startswith(".") for part in f.relative_to(path).parts)
        )
        documents = [document for file in files for document in _read_file(file, path, in_folder=True)]
    else:
        documents = _read_file(path, path.parent, in_folder=False)
    if not documents:
        raise ValueError(f"{path}: holds no documents")
    seen: dict[str, str] = {}
    for document in documents:
        if document.document_id in seen:
            raise ValueError(
                f"{document.source}: document id {document.document_id!r} is also a document of "
                f"{seen[document.document_id]} (ids must be unique)"
            )
        seen[document.document_id] = document.source
    return documents


def is_licence(path: Path) -> bool:
    return path.name.split(".")[0].upper() in LICENCE_NAMES


def _read_file(path: Path, root: Path, in_folder: bool) -> list[Document]:
    """A file's documents; in a folder, ids are prefixed by the file's path in it."""
    name = path.relative_to(root).as_posix()
    licence = licence_of(path, root)
    try:
        content = path.read_text()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if path.suffix.lower() != ".jsonl":
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", content) if p.strip()]
        return [Document(f"{name}:{index}", text, str(path), licence) for index, text in enumerate(paragraphs, 1)]
    documents = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from None
        text = _row_text(row)
        if text is None:
            raise ValueError(
                f"{path}:{number}: field text: a non-empty string is needed (or a dataset row's "
                "statement and solution: question/answer, problem/solution, prompt/answer …)"
            )
        row_licence = row.get("license", row.get("licence"))
        given = row.get("id")
        row_id = f"{name}:{number}" if given is None else f"{name}:{given}" if in_folder else str(given)
        documents.append(Document(row_id, text, str(path), str(row_licence) if row_licence else licence))
    return documents


def _row_text(row) -> str | None:
    """A row's document: its `text`, or a dataset row's statement and solution."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("text"), str) and row["text"].strip():
        return row["text"].strip()
    for statement, solution in DATASET_FIELDS:
        answer = row.get(solution)
        answer = (
            "\n".join(map(str, answer))
            if isinstance(answer, list)
            else str(answer)
            if isinstance(answer, (int, float)) and not isinstance(answer, bool)
            else answer
        )
        if isinstance(row.get(statement), str) and isinstance(answer, str) and row[statement].strip():
            return f"{row[statement].strip()}\n{answer.strip()}"
    return None


def licence_of(path: Path, root: Path) -> str | None:
    """The SPDX id of the nearest licence file (LICENSE, LICENCE or COPYING, any suffix) from `path`'s folder up to
    `root` (a single file: its own folder), read from its text (tasks/proposals/licences.py), or
    `LicenseRef-unknown (<file>)` when the text is not one it knows; None when there is no licence file."""
    folder = path.parent
    while True:
        for candidate in sorted(folder.iterdir()):
            if candidate.is_file() and is_licence(candidate):
                return licence_of_file(candidate.read_text(errors="replace"), str(candidate))
        if folder == root or folder == folder.parent or root not in folder.parents:
            return None
        folder = folder.parent


TOWNS = ["Arlen", "Bexley", "Corran", "Dunmore", "Elsby", "Farrow", "Glenna", "Hollis", "Ivers", "Jarrow"]
THINGS = ["bakeries", "schools", "bridges", "libraries", "markets", "wells", "mills", "inns"]


def generate_documents(count: int, seed: int = 0) -> list[Document]:
    """Passages with numbers and facts about fictional towns (what the tests and the demo corpus use)."""
    documents = []
    for index in range(count):
        rng = random.Random(f"{seed}:{index}")
        town, (first, second) = rng.choice(TOWNS), rng.sample(THINGS, 2)
        a, b, people = rng.randint(2, 40), rng.randint(2, 40), rng.randint(100, 9000)
        text = (
            f"{town} is a town of {people} people. It has {a} {first} and {b} {second}. "
            f"The river through {town} is {rng.randint(3, 90)} km long."
        )
        documents.append(Document(f"generated:{seed}:{index}", text))
    return documents


def challenger_prompt(document: Document) -> str:
    return (
        f"Document:\n{document.text}\nWrite a question this document answers in a ```question``` block, "
        "its answer in an ```answer``` block and the sentence it rests on in a ```span``` block.\n"
    )


def _squash(text: str) -> str:
    return " ".join(text.split())


def words(text: str) -> list[str]:
    """Whole tokens, case and width aside, without articles: numbers keep their inner separators (3.5, 1,000), so
    neither "5" nor "000" is a token of them; punctuation is no token."""
    return [token for token in TOKEN.findall(unicodedata.normalize("NFKC", text).lower()) if token not in ARTICLES]


def holds(tokens: list[str], part: list[str]) -> bool:
    """`part` is a contiguous run of whole `tokens`."""
    return bool(part) and any(tokens[start : start + len(part)] == part for start in range(len(tokens) - len(part) + 1))


def answer_issue(question: str, answer: str, span: str) -> Rejection | None:
    """SPICE's challenger filter, as far as it is cheap to check: the answer is a run of whole words of the span,
    neither trivial nor the whole span nor longer than a short answer, a number where the question asks how many,
    how much or what year, not in the question, and the question is about the span (they share a content word)."""
    said, cited, asked = words(answer), words(span), words(question)
    if not holds(cited, said):
        return Rejection("answer_not_in_span", f"the answer {answer[:80]!r} is not a run of whole words of the span")
    if all(w in STOP_WORDS for w in said) or (len(said) == 1 and len(said[0]) == 1 and not said[0].isdigit()):
        return Rejection("trivial_answer", f"the answer {answer[:80]!r} is stop words only or a single letter")
    if said == cited:
        return Rejection("answer_is_span", "the span is the answer alone: it must be the passage that supports it")
    if len(said) > MAX_ANSWER_WORDS:
        return Rejection("answer_too_long", f"the answer has {len(said)} words (at most {MAX_ANSWER_WORDS})")
    if NUMBER_QUESTION.search(" ".join(asked)) and not any(NUMBER.fullmatch(w) or w in NUMBER_WORDS for w in said):
        return Rejection("answer_not_a_number", "the question asks for a number and the answer holds none")
    if holds(asked, said):
        return Rejection("answer_in_question", "the question gives its answer away")
    if not (set(asked) - STOP_WORDS) & set(cited):
        return Rejection("question_not_about_span", "the question shares no content word with its span")
    return None


def parse_challenge(text: str, document: Document) -> Challenge | Rejection:
    """The challenge in a challenger's response, or the rule it breaks."""
    blocks = {kind: body.strip() for kind, body in BLOCK.findall(text)}
    if not all(blocks.get(kind) for kind in ("question", "answer", "span")):
        return Rejection("unparseable", "needs question, answer and span blocks")
    question, answer, span = blocks["question"], blocks["answer"], blocks["span"]
    if max(len(question), len(answer), len(span)) > MAX_CHARS:
        return Rejection("unparseable", f"a block longer than {MAX_CHARS} characters")
    if _squash(span) not in _squash(document.text) or not holds(words(document.text), words(span)):
        return Rejection("span_not_in_document", f"the span {span[:80]!r} is not a passage of {document.document_id}")
    issue = answer_issue(question, answer, span)
    if issue is not None:
        return issue
    key = hashlib.sha256(json.dumps([document.document_id, normalise_answer(question)]).encode()).hexdigest()[:24]
    return Challenge(question, answer, _squash(span), key)


def challenge_text(question: str, answer: str, span: str) -> str:
    """A challenge as a challenger writes it (the warm-up's worked examples)."""
    return f"```question\n{question}\n```\n```answer\n{answer}\n```\n```span\n{span}\n```\n"


def variance_reward(solve_rate: float | None, width: float = 0.01) -> float:
    """SPICE's challenger reward for a valid task: a Gaussian of the variance p(1−p) of the reasoner's
    correctness, centred on ¼ (p = ½), with variance `width` (exp(−3.125) ≈ 0.04 at p = 0 or 1 for the
    default width); 0 when the reasoner never tried it (no solve rate)."""
    if solve_rate is None:
        return 0.0
    variance = solve_rate * (1.0 - solve_rate)
    return math.exp(-((variance - 0.25) ** 2) / (2.0 * width))
