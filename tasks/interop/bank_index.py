"""A trainer's (prompt, label) traced back to the bank's problem, so a reward server scores it with the problem's own
verifier and records it under the problem's id.

OpenRLHF sends no ids: only the prompt as the policy saw it (template applied) and the label column of the
dataset (`rlvr export --to openrlhf` writes the bank's ground truth there). A problem matches when its ground
truth equals the label and its statement lies inside the prompt; of several, the longest statement wins. A label
no problem matches is scored as it stands (`rewards.problem_from`) under an `ext-…` id.
"""

from __future__ import annotations

import polars as pl

from storage.lake import Lake
from tasks.curation.stage import bank_problems
from tasks.interop.formats import ground_truth
from tasks.interop.recording import external_problem_id
from tasks.interop.rewards import problem_from

FIELDS = ["problem_id", "domain", "prompt", "answer", "tests", "entry_point", "verifier", "steps", "metadata", "params"]


class BankIndex:
    """The bank's problems by id and by ground truth."""

    def __init__(self, problems: pl.DataFrame):
        rows = problems.select(FIELDS).unique("problem_id").iter_rows(named=True) if problems.height else []
        self._by_id: dict[str, dict] = {}
        self._by_truth: dict[str, list[dict]] = {}
        self._by_prompt: dict[str, dict | None] = {}
        for row in rows:
            self._by_id[row["problem_id"]] = row
            self._by_truth.setdefault(ground_truth(row).strip(), []).append(row)

    @classmethod
    def of(cls, lake: Lake) -> BankIndex:
        """Every split of the lake's bank (an empty index where nothing was curated)."""
        return cls(bank_problems(lake, None, None) if lake.exists("problems") else pl.DataFrame())

    def __len__(self) -> int:
        return len(self._by_id)

    def match_prompt(self, prompt: str) -> dict | None:
        """The problem whose statement lies inside `prompt` (TRL logs the prompt alone), the longest of several."""
        if prompt not in self._by_prompt:
            candidates = [row for row in self._by_id.values() if row["prompt"] in prompt]
            self._by_prompt[prompt] = max(candidates, key=lambda row: len(row["prompt"])) if candidates else None
        return self._by_prompt[prompt]

    def match(self, prompt: str, label: str) -> dict | None:
        candidates = [row for row in self._by_truth.get(label.strip(), []) if row["prompt"] in prompt]
        return max(candidates, key=lambda row: len(row["prompt"])) if candidates else None

    def resolve(
        self,
        prompt: str,
        label: str | None,
        problem_id: str | None = None,
        domain: str | None = None,
        verifier: str | None = None,
    ) -> dict:
        """The problem a response answers: the bank's row by id, else by label and prompt, else the label as
        it stands under an `ext-…` id."""
        if problem_id and problem_id in self._by_id:
            return self._by_id[problem_id]
        if label is None:
            raise ValueError(f"problem {problem_id!r} is not in the bank and the item has no label (ground truth)")
        found = self.match(prompt, label)
        if found is not None:
            return found
        return problem_from(label, domain, verifier, problem_id or external_problem_id(prompt, label))
