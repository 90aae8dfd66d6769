"""The query-vector cache: the last few thousand query texts' vectors, per model.

A query vector is a function of (model, text), and asks repeat (a seat's recall on the same
trigger, the prefetch and a builtin on the same ask), so a repeated query skips the model run —
the largest part of a server-embedded RecallNotes. Only queries go through it: a note's text is
embedded once, and caching writes would only evict the queries. Touched on the event loop only.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["QueryCache"]


class QueryCache:
    """An LRU of unit vectors keyed by (model, text), bounded by entries; 0 entries is off."""

    def __init__(self, entries: int):
        self.entries = max(0, entries)
        self._store: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def get(self, model: str, text: str) -> np.ndarray | None:
        if not self.entries:
            return None
        vec = self._store.get((model, text))
        if vec is None:
            self.misses += 1
            return None
        self._store.move_to_end((model, text))
        self.hits += 1
        return vec

    def put(self, model: str, text: str, values: np.ndarray) -> np.ndarray:
        """Keep a read-only copy (a caller that scales its vector in place must not change what the
        next caller reads) and return it."""
        if not self.entries:
            return values
        kept = np.array(values, dtype=np.float32, copy=True)
        kept.setflags(write=False)
        self._store[(model, text)] = kept
        self._store.move_to_end((model, text))
        while len(self._store) > self.entries:
            self._store.popitem(last=False)
        return kept
