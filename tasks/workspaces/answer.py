"""Reading a candidate's files out of its response.

The format (shown in every workspace prompt): one fenced block per file, its path in the block's
info string — ```` ```python kv/store.py ```` — or on the line just before the block (`kv/store.py:`,
`# kv/store.py`, `**kv/store.py**`), or as a first-line comment inside it (`# kv/store.py`). With a
single file to write, one block without a path is that file. Only the files the problem asks for
are taken (a response cannot overwrite the tests or the given files); a later block for the same
path replaces an earlier one.
"""

from __future__ import annotations

import re

FENCE = re.compile(r"^```[ \t]*([^\n`]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_PATH_TOKEN = re.compile(r"[A-Za-z0-9_./-]+\.[A-Za-z0-9]+")


def extract_files(response: str, wanted: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the wanted files found, the wanted files missing)."""
    found: dict[str, str] = {}
    unnamed: list[str] = []
    for match in FENCE.finditer(response):
        info, body = match.group(1).strip(), match.group(2)
        path = _path_in(info, wanted) or _path_before(response, match.start(), wanted)
        if path is None:
            first, _, rest = body.partition("\n")
            path = _path_in(first.lstrip("#/ ").strip(), wanted) if first.lstrip().startswith(("#", "//")) else None
            if path is not None:
                body = rest
        if path is None:
            unnamed.append(body)
        else:
            found[path] = body
    if len(wanted) == 1 and wanted[0] not in found and unnamed:
        found[wanted[0]] = unnamed[-1]
    return found, [name for name in wanted if name not in found]


def _path_in(text: str, wanted: list[str]) -> str | None:
    for token in reversed(_PATH_TOKEN.findall(text.replace("title=", " ").replace("path=", " "))):
        token = token.strip("\"'`*:").removeprefix("./")
        if token in wanted:
            return token
    return None


def _path_before(response: str, start: int, wanted: list[str]) -> str | None:
    before = response[:start].rstrip("\n").rsplit("\n", 1)[-1]
    return _path_in(before.strip(" #*:`"), wanted) if len(before) <= 200 else None
