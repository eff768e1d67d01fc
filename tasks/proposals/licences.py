"""A licence file's text → its SPDX id, recognised by phrases each licence's own text carries (what GitHub's licensee
and scancode do far more thoroughly). A text not recognised is marked so, with its file, never named after its first
line, which is as often a title ("The MIT License (MIT)") or a copyright line as a licence's name. Pure.

The GNU licences are named `-only`: their full text is the same whether a work takes "or any later version", which
its own notices, not the licence file, say.
"""

from __future__ import annotations

import re
import unicodedata

UNKNOWN = "LicenseRef-unknown"

# (SPDX id, phrases all found in the normalised text), most specific first: the first entry that matches wins (the
# LGPL's text names the GPL, a BSD-3 text holds every BSD-2 phrase, MIT-0 is MIT without the notice condition).
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AGPL-3.0-only", ("gnu affero general public license version 3",)),
    ("LGPL-3.0-only", ("gnu lesser general public license version 3",)),
    ("LGPL-2.1-only", ("gnu lesser general public license version 2.1",)),
    ("LGPL-2.0-only", ("gnu library general public license version 2",)),
    ("GPL-3.0-only", ("gnu general public license version 3",)),
    ("GPL-2.0-only", ("gnu general public license version 2",)),
    ("Apache-2.0", ("apache license version 2.0",)),
    ("Apache-2.0", ("apache license, version 2.0",)),
    ("MPL-2.0", ("mozilla public license version 2.0",)),
    ("MPL-2.0", ("mozilla public license, v. 2.0",)),
    ("BSL-1.0", ("boost software license - version 1.0",)),
    ("CC-BY-NC-SA-4.0", ("attribution-noncommercial-sharealike 4.0 international",)),
    ("CC-BY-NC-ND-4.0", ("attribution-noncommercial-noderivatives 4.0 international",)),
    ("CC-BY-NC-4.0", ("attribution-noncommercial 4.0 international",)),
    ("CC-BY-ND-4.0", ("attribution-noderivatives 4.0 international",)),
    ("CC-BY-SA-4.0", ("attribution-sharealike 4.0 international",)),
    ("CC-BY-4.0", ("attribution 4.0 international",)),
    ("CC-BY-SA-3.0", ("attribution-sharealike 3.0 unported",)),
    ("CC-BY-3.0", ("attribution 3.0 unported",)),
    ("CC0-1.0", ("cc0 1.0 universal",)),
    ("ODC-By-1.0", ("open data commons attribution license",)),
    ("PDDL-1.0", ("public domain dedication and licen",)),
    ("ODbL-1.0", ("open database license",)),
    ("Unlicense", ("free and unencumbered software released into the public domain",)),
    (
        "ISC",
        (
            "distribute this software for any purpose with or without fee is hereby granted",
            "provided that the above copyright notice and this permission notice appear in all copies",
        ),
    ),
    ("0BSD", ("distribute this software for any purpose with or without fee is hereby granted",)),
    ("BSD-4-Clause", ("redistribution and use in source and binary forms", "advertising materials mentioning")),
    ("BSD-3-Clause", ("redistribution and use in source and binary forms", "endorse or promote products")),
    ("BSD-2-Clause", ("redistribution and use in source and binary forms",)),
    (
        "MIT",
        (
            "permission is hereby granted, free of charge, to any person obtaining a copy",
            "the above copyright notice and this permission notice shall be included",
        ),
    ),
    ("MIT-0", ("permission is hereby granted, free of charge, to any person obtaining a copy",)),
)
KNOWN_IDS = {spdx.lower(): spdx for spdx, _ in RULES}
_ID = r"[A-Za-z0-9.+-]+"
TAG = re.compile(rf"spdx-license-identifier:[ \t]*({_ID}(?:[ \t]+(?:OR|AND|WITH)[ \t]+{_ID})*)", re.I)
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})


def normalise(text: str) -> str:
    """Case, width, typographic quotes and dashes, whitespace and line breaks aside."""
    return " ".join(unicodedata.normalize("NFKC", text).translate(_QUOTES).lower().split())


def spdx_of(text: str) -> str | None:
    """The licence `text` is: an `SPDX-License-Identifier:` tag, else a known licence's phrases, else a line that is
    exactly a known id (a file holding only `CC-BY-4.0`); None when none of these."""
    tag = TAG.search(text)
    if tag:
        return tag.group(1)
    flat = normalise(text)
    for spdx, phrases in RULES:
        if all(phrase in flat for phrase in phrases):
            return spdx
    lines = (line.strip() for line in text.splitlines())
    return next((KNOWN_IDS[line.lower()] for line in lines if line.lower() in KNOWN_IDS), None)


def licence_of_file(text: str, path: str) -> str:
    """`spdx_of(text)`, else `LicenseRef-unknown (<path>)`: a licence file is there, what it grants is to be read."""
    return spdx_of(text) or f"{UNKNOWN} ({path})"
