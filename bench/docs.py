"""Figures in the docs come from result files: `python -m bench.docs` re-renders every figure region of the pages
(PAGES: docs/benchmarks.md, the README and the pages that quote a figure) from `bench/results/*.json`; `--check`
only says whether they are current.

A region is a template in an HTML comment, followed by what it renders to, up to a closing comment:

    <!-- figures dedup `rlvr bench dedup --save dedup`: took {{dedup.figures.sizes[0].seconds:.2f}} s -->
    took 2.79 s
    <!-- /figures -->

`{{NAME.path.to[0].value:spec}}` is a value of result NAME with a Python format spec; `{{NAME:provenance}}` says
when, on which commit and host it was measured. A region whose results are not all on record renders as the
command that makes them; a placeholder whose result lacks the field is a FigureError, naming both. Outside
placeholders a template holds no measured number: digits only in inline code (commands, files), in targets
(`target ≥ 3`), in names (GSM8K, MATH-500) and in the comments themselves (see `literal_figures`). The rule holds
for the whole of docs/benchmarks.md and for every region's template in the README (tests/bench/test_bench_results.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from bench.results import RESULTS, ROOT, load_results

PAGES = (
    ROOT / "docs" / "benchmarks.md",
    ROOT / "README.md",
    *(
        ROOT / "docs" / f"{page}.md"
        for page in (
            "autonomous",
            "concepts",
            "curation",
            "getting-started",
            "index",
            "operating",
            "sandbox",
            "scale-out",
            "training",
            "verification",
        )
    ),
)
REGION = re.compile(
    r"<!-- figures (?P<names>[\w,-]+) `(?P<command>[^`]+)`: (?P<template>.*?) -->\n"
    r"(?P<rendered>.*?)<!-- /figures -->",
    re.S,
)
PLACEHOLDER = re.compile(r"\{\{\s*(?P<path>[\w.\[\] -]+?)\s*(?::(?P<spec>[^}]*))?\}\}")
NUMBER = re.compile(r"(?<![\w.-])\d[\d.,]*(?!\w)")  # a number standing alone: not GSM8K, MATH-500 or S3
ALLOWED_DIGITS = re.compile(r"`[^`]*`|\btargets? (?:of )?[≥≤<>=]+ ?[-+×]?[\d.,]+ ?%?|<!--.*?-->|\]\([^)]*\)", re.S)


def value_at(results: dict[str, dict], path: str) -> Any:
    """`name.figures.a[0].b` looked up in the results (KeyError / IndexError when absent)."""
    name, _, rest = path.partition(".")
    value: Any = results[name]
    for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", rest):
        value = value[int(index)] if index else value[key]
    return value


def provenance(result: dict) -> str:
    host = result.get("host") or {}
    load = f", load average {host['load_average'][1]:.1f} over the last 5 minutes" if host.get("load_average") else ""
    isa = f", {ISA_NAMES.get(host['isa'], host['isa'])}" if host.get("isa") else ""
    return (
        f"measured {result['date'][:10]} on commit {str(result['commit'])[:7]}, {host.get('cores')} cores "
        f"({host.get('cpu')}{isa}){load}"
    )


ISA_NAMES = {"avx512": "AVX-512", "avx2": "AVX2", "default": "no vector instructions"}


class FigureError(ValueError):
    """A placeholder that no result answers: the page cannot be rendered until the template or the result changes."""


def fill(template: str, results: dict[str, dict], names: list[str]) -> str:
    """The template with each placeholder replaced; one naming a result outside `names` (the region's list, which
    decides when it has no result on record) or a field its result lacks is a FigureError naming both."""

    def one(match: re.Match) -> str:
        path, spec = match["path"], match["spec"] or ""
        name = path.partition(".")[0]
        if name not in names:
            raise FigureError(f"{match.group(0)}: result {name!r} is not among the region's names {names}")
        try:
            return provenance(results[path]) if spec == "provenance" else format(value_at(results, path), spec)
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise FigureError(f"{match.group(0)}: bench/results/{name}.json has no such figure ({error!r})") from None

    return PLACEHOLDER.sub(one, template)


def render_region(match: re.Match, results: dict[str, dict]) -> str:
    names = match["names"].split(",")
    head = match.group(0)[: match.start("rendered") - match.start()]
    missing = [name for name in names if name not in results]
    if missing:
        body = f"*No result on record for {', '.join(missing)}: run `{match['command']} --format json`.*"
    else:
        body = fill(match["template"], results, names)
    return f"{head}{body}\n<!-- /figures -->"


def render(text: str, results: dict[str, dict]) -> str:
    """`text` with every figure region rendered from `results`."""
    return REGION.sub(lambda match: render_region(match, results), text)


def literal_figures(text: str) -> list[str]:
    """Measured-looking numbers written by hand: digits outside placeholders, inline code, targets, comments and
    link targets: each line that holds one. Headings' and list markers' digits are not figures either."""
    stripped = PLACEHOLDER.sub("", ALLOWED_DIGITS.sub("", text))
    lines = (re.sub(r"^\s*(#+ |\d+\. )", "", line) for line in stripped.splitlines())
    return [line.strip()[:100] for line in lines if NUMBER.search(line)]


def templates(text: str) -> str:
    """The text as written by hand: the region templates and everything outside regions, not what they render to."""
    return REGION.sub(lambda match: match["template"], text)


def commands(text: str) -> dict[str, str]:
    """Each result name in the text's regions and the command that makes it."""
    return {name: match["command"] for match in REGION.finditer(text) for name in match["names"].split(",")}


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str], results_folder: Path = RESULTS, pages: tuple[Path, ...] = PAGES) -> int:
    results = load_results(results_folder)
    stale = []
    for page in pages:
        text = page.read_text()
        rendered = render(text, results)
        if rendered != text:
            stale.append(page)
            if "--check" not in argv:
                page.write_text(rendered)
                print(f"rendered {shown(page)}")
    if "--check" in argv and stale:
        print("stale: " + ", ".join(map(shown, stale)) + " (run `python -m bench.docs`)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
