"""The lexical half in memory, as the stores rank it: a row matches when it shares any word with
the query; matches are ranked by the summed inverse document frequency (over the matched rows) of
the words they share. Words are lowercased alphanumerics minus a few stop words — a stand-in for
Postgres' English text search, not a copy of its stemmer."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["cosine", "idf_ranked", "words"]

T = TypeVar("T")

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an and are as at be by for from how i in is it of on or the to was what when which who with".split()
)


def words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def idf_ranked(rows: Sequence[T], text: Callable[[T], str], query: str) -> list[tuple[T, float]]:
    """The rows sharing a word with ``query`` and their rank, unordered."""
    wanted = words(query)
    matched = [(r, words(text(r)) & wanted) for r in rows]
    matched = [(r, shared) for r, shared in matched if shared]
    df: dict[str, int] = {}
    for _, shared in matched:
        for w in shared:
            df[w] = df.get(w, 0) + 1
    n = len(matched)
    return [
        (r, round(sum(math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) for w in shared), 9)) for r, shared in matched
    ]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b) / float(np.linalg.norm(a) * np.linalg.norm(b))
