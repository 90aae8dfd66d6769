"""A vector index that refuses its writes while ``refusing`` is set, as a Qdrant that went away
between a write's search and its upsert does, and answers its searches from the real adapter it
wraps: the index is "down" for what is written meanwhile, then "back" without those points."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from libs.common.vectorindex import IndexHit, IndexPoint, IndexUnavailable, VectorIndex
from libs.common.vectorindex._port import SearchScope

__all__ = ["RefusingIndex"]


class RefusingIndex(VectorIndex):
    def __init__(self, inner: VectorIndex) -> None:
        self.inner = inner
        self.name = inner.name
        self.refusing = False

    async def upsert(self, collection: str, points: Sequence[IndexPoint]) -> None:
        if self.refusing:
            raise IndexUnavailable(f"{self.inner.name}: refusing writes (the test took it down)")
        await self.inner.upsert(collection, points)

    async def prepare(self, collection: str, dimensions: int) -> None:
        await self.inner.prepare(collection, dimensions)

    async def delete(self, collection: str, ids: Sequence[uuid.UUID]) -> None:
        await self.inner.delete(collection, ids)

    async def _nearest(self, collection: str, query: np.ndarray, scope: SearchScope, limit: int) -> list[IndexHit]:
        return await self.inner._nearest(collection, query, scope, limit)

    async def reset(self, collection: str) -> None:
        await self.inner.reset(collection)

    async def count(self, collection: str) -> int:
        return await self.inner.count(collection)

    async def collections(self) -> list[str]:
        return await self.inner.collections()

    async def point_ids(self, collection: str, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        return await self.inner.point_ids(collection, after, limit)

    async def close(self) -> None:
        await self.inner.close()
