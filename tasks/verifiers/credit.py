"""Partial credit for test-based rewards, one rule per domain (`verify.verifiers.<name>.partial_credit`).

- `all_pass`: 1 when every test passes, else 0.
- `half`: the design's rule for code: all pass 1, some pass 0.5, none 0.
- `fraction`: the share of tests passed.

`none` and `seed` are the older names of `all_pass` and `half`, still accepted.
"""

from __future__ import annotations

RULES = ("all_pass", "half", "fraction")
ALIASES = {"none": "all_pass", "seed": "half"}


def credit_rule(name: str) -> str:
    """The rule's canonical name; a clear error for an unknown one."""
    rule = ALIASES.get(name, name)
    if rule not in RULES:
        raise ValueError(f"partial_credit must be one of {', '.join(RULES)}, not {name!r}")
    return rule


def credit(passed: int, total: int, rule: str) -> float:
    """The reward for `passed` of `total` tests under `rule`."""
    rule = credit_rule(rule)
    if total <= 0 or passed <= 0:
        return 0.0
    if passed >= total:
        return 1.0
    return passed / total if rule == "fraction" else 0.5 if rule == "half" else 0.0
