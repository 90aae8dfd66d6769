"""What the prefetch's model calls share: prompt files, the content words the offline rules match
on, and reading a JSON object out of a model's answer."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from string import Template

from libs.common import text_caches
from libs.common.auxmodel.answers import InvalidOutput, parse_object

__all__ = ["InvalidOutput", "content_words", "parse_object", "prompt"]

_PROMPTS = Path(__file__).resolve().parent / "prompts"

_STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing done down during each few for from further
    get got had has have having he her here hers him his how i if in into is it its itself just let
    like may me might more most must my no nor not now of off on once only or other our ours out over
    own please same she should so some such than that the their them then there these they this those
    through to too under until up us very was we were what when where which while who whom why will
    with would you your yours yes ok okay thanks thank hi hello hey need needs want wants know make
    made new one two see look looks going go ask asked asks tell told said say says today tomorrow
    yesterday still there's it's i'm we're let's can't don't
    """.split()
)
_WORD = re.compile(r"[a-z0-9][a-z0-9_.\-]*[a-z0-9]|[a-z0-9]")


def prompt(name: str) -> Template:
    """A prompt file as a ``$name`` template (the file's final newline is not part of it)."""
    return Template((_PROMPTS / name).read_text().rstrip("\n"))


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def content_words(text: str, *, stem: bool = True) -> list[str]:
    """The words of ``text`` that carry content, lowercased (and crudely stemmed unless ``stem`` is
    false), in order, once each: the offline rules' notion of "sharing a word"."""
    return list(_content_words(text, stem))


@functools.lru_cache(maxsize=8192)
def _content_words(text: str, stem: bool) -> tuple[str, ...]:
    # Remembered by text: the offline filter re-reads the same notes of a seat turn after turn
    # (a pool of ~150), and the regex and stemming were its largest Python cost (analysis §2.1).
    # The cache holds note text (and asks): every erasure this process serves empties it
    # (``libs.common.text_caches``, registered below).
    seen: dict[str, None] = {}
    for raw in _WORD.findall(text.casefold()):
        word = raw.strip(".-_")
        if len(word) < 3 or word in _STOPWORDS or word.isdigit():
            continue
        seen.setdefault(_stem(word) if stem else word, None)
    return tuple(seen)


text_caches.register(_content_words.cache_clear)
