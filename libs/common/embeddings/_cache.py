"""The query-vector cache: the last few thousand query texts' vectors, per model.

A query vector is a function of (model, text), and asks repeat (a seat's recall on the same
trigger, the prefetch and a builtin on the same ask), so a repeated query skips the model run —
the largest part of a server-embedded RecallNotes. Only queries go through it: a note's text is
embedded once, and caching writes would only evict the queries. Touched on the event loop only.

A query is often what a person asked, word for word (the prefetch embeds a turn's ask whole), so
the cache keeps a digest of the text, never the text, and is emptied by every erasure this process
serves (``libs.common.text_caches``): a vector derived from an erased person's words does not
outlive the erasure here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from libs.common import text_caches

__all__ = ["QueryCache"]


def _key(model: str, text: str) -> tuple[str, bytes]:
    return model, hashlib.sha256(text.encode()).digest()


class QueryCache:
    """An LRU of unit vectors keyed by (model, a digest of the text), bounded by entries; 0 entries
    is off."""

    def __init__(self, entries: int):
        self.entries = max(0, entries)
        self._store: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0
        text_caches.track(self)

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        """Forget every query (an erasure: ``text_caches.clear_all``)."""
        self._store.clear()

    def get(self, model: str, text: str) -> np.ndarray | None:
        if not self.entries:
            return None
        key = _key(model, text)
        vec = self._store.get(key)
        if vec is None:
            self.misses += 1
            return None
        self._store.move_to_end(key)
        self.hits += 1
        return vec

    def put(self, model: str, text: str, values: np.ndarray) -> np.ndarray:
        """Keep a read-only copy (a caller that scales its vector in place must not change what the
        next caller reads) and return it."""
        if not self.entries:
            return values
        kept = np.array(values, dtype=np.float32, copy=True)
        kept.setflags(write=False)
        key = _key(model, text)
        self._store[key] = kept
        self._store.move_to_end(key)
        while len(self._store) > self.entries:
            self._store.popitem(last=False)
        return kept
