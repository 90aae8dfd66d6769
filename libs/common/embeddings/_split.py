from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_WORD = re.compile(r"\S+\s*")


def split_between_words(text: str, costs: Callable[[Sequence[str]], list[int]], limit: int) -> list[str]:
    """Greedy split of ``text`` into pieces of at most ``limit`` cost, breaking only between words.

    ``costs`` prices a batch of words (tokens for the local model, bytes for a remote one); the
    price of a piece is the sum of its words', which holds for WordPiece since it never merges
    across whitespace. A single word too long to fit on its own is cut by characters, the only way
    it can be embedded at all. Nothing is dropped.
    """
    words = _WORD.findall(text)
    if not words:
        return [text] if text else []
    prices = costs(words)
    if sum(prices) <= limit:
        return [text]
    pieces: list[str] = []
    current, spent = "", 0
    for word, price in zip(words, prices, strict=True):
        if price > limit:
            if current.strip():
                pieces.append(current.rstrip())
            current, spent = "", 0
            pieces.extend(_cut_word(word.rstrip(), costs, limit))
            continue
        if spent + price > limit:
            pieces.append(current.rstrip())
            current, spent = "", 0
        current += word
        spent += price
    if current.strip():
        pieces.append(current.rstrip())
    return pieces


def _cut_word(word: str, costs: Callable[[Sequence[str]], list[int]], limit: int) -> list[str]:
    out = []
    rest = word
    while rest:
        if costs([rest])[0] <= limit:
            out.append(rest)
            break
        lo, hi = 1, len(rest)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if costs([rest[:mid]])[0] <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append(rest[:lo])
        rest = rest[lo:]
    return out
