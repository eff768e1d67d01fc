"""SPICE-style document-grounded tasks: a challenger reads a document and writes a question, its answer
and the span of the document it rests on; the reasoner then answers the question without the
document. Pure: documents and responses in, tasks or rejections out.

A challenge is three fenced blocks, ```question```, ```answer``` and ```span```. It is valid when the
span is a passage of the document (whitespace aside), the answer appears in the span (so the span
supports it), the question does not give the answer away, and the question was not asked before of
that document. The challenger's reward peaks for tasks the reasoner solves half the time:
1 − 2·|solve rate − ½|.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tasks.selfplay.code_tasks import Rejection
from tasks.verifiers.qa import normalise_answer

BLOCK = re.compile(r"```[ \t]*(question|answer|span)[ \t]*\n(.*?)```", re.DOTALL)
MAX_CHARS = 400


@dataclass(frozen=True)
class Document:
    document_id: str
    text: str


@dataclass(frozen=True)
class Challenge:
    question: str
    answer: str
    span: str
    key: str                      # what a repeat of the question on the same document shares


def read_documents(path: str | Path) -> list[Document]:
    """A corpus: JSONL (one `{"id": ..., "text": ...}` per line) or text (paragraphs between blank lines).
    Bad lines are errors naming the file, the line and the field."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such documents file")
    if path.suffix == ".jsonl":
        documents = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
                raise ValueError(f"{path}:{number}: field text: a non-empty string is needed")
            documents.append(Document(str(row.get("id", f"{path.stem}:{number}")), row["text"].strip()))
    else:
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", path.read_text()) if p.strip()]
        documents = [Document(f"{path.stem}:{index}", text) for index, text in enumerate(paragraphs, start=1)]
    if not documents:
        raise ValueError(f"{path}: holds no documents")
    return documents


TOWNS = ["Arlen", "Bexley", "Corran", "Dunmore", "Elsby", "Farrow", "Glenna", "Hollis", "Ivers", "Jarrow"]
THINGS = ["bakeries", "schools", "bridges", "libraries", "markets", "wells", "mills", "inns"]


def generate_documents(count: int, seed: int = 0) -> list[Document]:
    """Passages with numbers and facts about fictional towns (what the tests and the demo corpus use)."""
    documents = []
    for index in range(count):
        rng = random.Random(f"{seed}:{index}")
        town, (first, second) = rng.choice(TOWNS), rng.sample(THINGS, 2)
        a, b, people = rng.randint(2, 40), rng.randint(2, 40), rng.randint(100, 9000)
        text = (f"{town} is a town of {people} people. It has {a} {first} and {b} {second}. "
                f"The river through {town} is {rng.randint(3, 90)} km long.")
        documents.append(Document(f"generated:{seed}:{index}", text))
    return documents


def challenger_prompt(document: Document) -> str:
    return (f"Document:\n{document.text}\nWrite a question this document answers in a ```question``` block, "
            "its answer in an ```answer``` block and the sentence it rests on in a ```span``` block.\n")


def _squash(text: str) -> str:
    return " ".join(text.split())


def parse_challenge(text: str, document: Document) -> Challenge | Rejection:
    """The challenge in a challenger's response, or the rule it breaks."""
    blocks = {kind: body.strip() for kind, body in BLOCK.findall(text)}
    if not all(blocks.get(kind) for kind in ("question", "answer", "span")):
        return Rejection("unparseable", "needs question, answer and span blocks")
    question, answer, span = blocks["question"], blocks["answer"], blocks["span"]
    if max(len(question), len(answer), len(span)) > MAX_CHARS:
        return Rejection("unparseable", f"a block longer than {MAX_CHARS} characters")
    if _squash(span) not in _squash(document.text):
        return Rejection("span_not_in_document", f"the span {span[:80]!r} is not a passage of {document.document_id}")
    if normalise_answer(answer) not in normalise_answer(span):
        return Rejection("answer_not_in_span", f"the answer {answer[:80]!r} is not in the span it cites")
    if normalise_answer(answer) in normalise_answer(question):
        return Rejection("answer_in_question", "the question gives its answer away")
    key = hashlib.sha256(json.dumps([document.document_id, normalise_answer(question)]).encode()).hexdigest()[:24]
    return Challenge(question, answer, _squash(span), key)


def challenge_text(question: str, answer: str, span: str) -> str:
    """A challenge as a challenger writes it (the warm-up's worked examples)."""
    return f"```question\n{question}\n```\n```answer\n{answer}\n```\n```span\n{span}\n```\n"


def peaked(solve_rate: float | None) -> float:
    """The challenger's reward for a valid task: 1 at a solve rate of ½, falling to 0 at 0 and at 1."""
    if solve_rate is None:
        return 0.0
    return max(0.0, 1.0 - 2.0 * abs(solve_rate - 0.5))
