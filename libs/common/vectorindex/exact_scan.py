"""The exact scan as an adapter of the vector-index port: every point of a collection compared by
cosine, filtered as the Qdrant adapters filter (company, seat, model, expiry, labels).

It is what the stores' Postgres fallback does (``ORDER BY embedding <=> $q`` over the seat's rows),
held here to the same conformance suite as both Qdrant adapters, over points kept in memory. The
unit tier uses it as the vector index of its fakes; a deployment never does (its points would not
survive a restart, and Postgres already keeps every vector).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from libs.common.vectorindex._port import IndexHit, IndexPoint, IndexUnavailable, SearchScope, VectorIndex

__all__ = ["ExactScanIndex"]


class ExactScanIndex(VectorIndex):
    name = "exact-scan"

    def __init__(self) -> None:
        self._collections: dict[str, dict[uuid.UUID, IndexPoint]] = {}
        self._closed = False
        self.available = True
        """False: every call raises ``IndexUnavailable``, as an unreachable server does (the unit
        tier's way to take the index down)."""

    def _check(self) -> None:
        if self._closed:
            raise IndexUnavailable("exact-scan index is closed")
        if not self.available:
            raise IndexUnavailable("exact-scan index is down")

    async def upsert(self, collection: str, points: Sequence[IndexPoint]) -> None:
        self._check()
        stored = self._collections.setdefault(collection, {})
        for p in points:
            vec = np.asarray(p.vector, dtype=np.float32)
            stored[p.id] = IndexPoint(p.id, vec, p.company, p.seat, p.model, p.expire_at, dict(p.labels))

    async def prepare(self, collection: str, dimensions: int) -> None:
        self._check()
        self._collections.setdefault(collection, {})

    async def delete(self, collection: str, ids: Sequence[uuid.UUID]) -> None:
        self._check()
        stored = self._collections.get(collection, {})
        for i in ids:
            stored.pop(i, None)

    async def _nearest(self, collection: str, query: np.ndarray, scope: SearchScope, limit: int) -> list[IndexHit]:
        self._check()
        qn = float(np.linalg.norm(query))
        hits: list[IndexHit] = []
        for p in self._collections.get(collection, {}).values():
            if not scope.admits(p):
                continue
            pn = float(np.linalg.norm(p.vector))
            if qn == 0.0 or pn == 0.0 or p.vector.shape != query.shape:
                continue
            hits.append(IndexHit(p.id, float(query @ p.vector) / (qn * pn)))
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits[:limit]

    async def reset(self, collection: str) -> None:
        self._check()
        self._collections.pop(collection, None)

    async def count(self, collection: str) -> int:
        self._check()
        return len(self._collections.get(collection, {}))

    async def collections(self) -> list[str]:
        self._check()
        return sorted(self._collections)

    async def point_ids(self, collection: str, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        self._check()
        ids = sorted(self._collections.get(collection, {}))
        if after is not None:
            ids = [i for i in ids if i > after]
        return ids[:limit]

    async def close(self) -> None:
        self._closed = True
