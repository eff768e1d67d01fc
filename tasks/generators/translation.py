"""Procedural English → French translation, with a reference built by rule (verifier `translation`).

Sentences from a small lexicon with the agreements French needs: article and adjective by the noun's
gender and number, most adjectives after the noun, the verb by the subject's number, `ne … pas` for
negation. Levels add structure: 1 a subject and a verb, 2 an adjective and an object, 3 negation and a
place, 4 two clauses joined by `and` / `but`. The reference is exact for the templates; the reward is a
similarity to it (chrF), since a correct translation may differ from it in small ways.
"""

from __future__ import annotations

import random

from tasks.generators.base import Generated

NOUNS = {  # english: (french, gender)
    "cat": ("chat", "m"),
    "dog": ("chien", "m"),
    "house": ("maison", "f"),
    "car": ("voiture", "f"),
    "child": ("enfant", "m"),
    "book": ("livre", "m"),
    "table": ("table", "f"),
    "bird": ("oiseau", "m"),
    "garden": ("jardin", "m"),
    "apple": ("pomme", "f"),
    "window": ("fenêtre", "f"),
    "friend": ("ami", "m"),
}
PLURAL = {"oiseau": "oiseaux"}
ADJECTIVES = {  # english: (masculine, feminine, masculine plural, feminine plural)
    "red": ("rouge", "rouge", "rouges", "rouges"),
    "small": ("petit", "petite", "petits", "petites"),
    "green": ("vert", "verte", "verts", "vertes"),
    "black": ("noir", "noire", "noirs", "noires"),
    "happy": ("heureux", "heureuse", "heureux", "heureuses"),
    "old": ("vieux", "vieille", "vieux", "vieilles"),
}
BEFORE_NOUN = {"small", "old"}
VERBS = {  # english (3rd sg, 3rd pl): (french sg, french pl)
    ("sleeps", "sleep"): ("dort", "dorment"),
    ("eats", "eat"): ("mange", "mangent"),
    ("sees", "see"): ("voit", "voient"),
    ("likes", "like"): ("aime", "aiment"),
    ("finds", "find"): ("trouve", "trouvent"),
}
TRANSITIVE = {"eats", "sees", "likes", "finds"}
PLACES = {"in the garden": "dans le jardin", "near the house": "près de la maison", "on the table": "sur la table"}


def _noun_phrase(rng: random.Random, with_adjective: bool) -> tuple[str, str, bool]:
    noun = rng.choice(sorted(NOUNS))
    french, gender = NOUNS[noun]
    plural = rng.random() < 0.4
    english_noun = "children" if noun == "child" and plural else noun + ("s" if plural else "")
    french_noun = PLURAL.get(french, french + "s") if plural else french
    article = "les" if plural else ("le" if gender == "m" else "la")
    if french_noun[0] in "aeéiouh" and not plural:
        article = "l'"
    if not with_adjective:
        return f"the {english_noun}", f"{article}{'' if article.endswith(chr(39)) else ' '}{french_noun}", plural
    adjective = rng.choice(sorted(ADJECTIVES))
    form = ADJECTIVES[adjective][(2 if plural else 0) + (1 if gender == "f" else 0)]
    if adjective in BEFORE_NOUN:
        article = "les" if plural else ("le" if gender == "m" else "la")
        return f"the {adjective} {english_noun}", f"{article} {form} {french_noun}", plural
    return (
        f"the {adjective} {english_noun}",
        f"{article}{'' if article.endswith(chr(39)) else ' '}{french_noun} {form}",
        plural,
    )


def _clause(rng: random.Random, level: int) -> tuple[str, str]:
    subject_en, subject_fr, plural = _noun_phrase(rng, with_adjective=level >= 2)
    verbs = [v for v in VERBS if level >= 2 or v[0] not in TRANSITIVE]
    english_forms = rng.choice(sorted(verbs))
    verb_en = english_forms[1] if plural else english_forms[0]
    verb_fr = VERBS[english_forms][1 if plural else 0]
    negated = level >= 3 and rng.random() < 0.5
    if negated:
        verb_en = ("do not " if plural else "does not ") + english_forms[1]
        verb_fr = ("n'" if verb_fr[0] in "aeiou" else "ne ") + verb_fr + " pas"
    english, french = f"{subject_en} {verb_en}", f"{subject_fr} {verb_fr}"
    if english_forms[0] in TRANSITIVE:
        object_en, object_fr, _ = _noun_phrase(rng, with_adjective=False)
        english, french = f"{english} {object_en}", f"{french} {object_fr}"
    if level >= 3 and rng.random() < 0.6:
        place = rng.choice(sorted(PLACES))
        english, french = f"{english} {place}", f"{french} {PLACES[place]}"
    return english, french


def translation(rng: random.Random, level: int = 2) -> Generated:
    english, french = _clause(rng, level)
    if level >= 4:
        joiner = rng.choice([("and", "et"), ("but", "mais")])
        second_en, second_fr = _clause(rng, 3)
        english, french = f"{english} {joiner[0]} {second_en}", f"{french} {joiner[1]} {second_fr}"
    english, french = english[0].upper() + english[1:] + ".", french[0].upper() + french[1:] + "."
    prompt = f"Translate into French:\n{english}\n\nGive only the translation, as <answer>…</answer>."
    return Generated(
        prompt=prompt,
        answer=french,
        solution=f"<answer>{french}</answer>",
        steps=[],
        params={"source_text": english, "target_language": "fr"},
    )
