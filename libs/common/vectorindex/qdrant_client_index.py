"""Qdrant through ``qdrant-client``: a server by URL, or the client's local mode (same API)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
from qdrant_client import AsyncQdrantClient, models

from libs.common.vectorindex._port import IndexHit, IndexPoint, IndexUnavailable, SearchScope, VectorIndex
from libs.common.vectorindex._qdrant import PAYLOAD_INDEXES, hits, page_request, scroll_page, unavailable, wire_point

__all__ = ["QdrantClientIndex"]

T = TypeVar("T")

_SCHEMAS: dict[str, models.PayloadSchemaType | models.KeywordIndexParams] = {
    "tenant": models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
    "keyword": models.PayloadSchemaType.KEYWORD,
    "float": models.PayloadSchemaType.FLOAT,
}
"""``PAYLOAD_INDEXES``' kinds in qdrant-client's types."""


class QdrantClientIndex(VectorIndex):
    name = "qdrant"

    def __init__(self, client: AsyncQdrantClient, *, timeout: float = 5.0):
        self._client = client
        self._timeout = timeout
        self._known: set[str] = set()
        self._create_lock = asyncio.Lock()

    @classmethod
    def for_url(cls, url: str | None, *, api_key: str | None = None) -> QdrantClientIndex:
        """A Qdrant server; ``url`` None is the client's default (localhost:6333), which is what
        ``vector_index: qdrant`` without a ``qdrant_url`` has always meant."""
        return cls(AsyncQdrantClient(url=url, api_key=api_key, timeout=5))

    @classmethod
    def local(cls, path: Path | None = None) -> QdrantClientIndex:
        """qdrant-client's local mode: in memory, or persisted under ``path``."""
        if path is None:
            return cls(AsyncQdrantClient(location=":memory:"))
        path.mkdir(parents=True, exist_ok=True)
        return cls(AsyncQdrantClient(path=str(path)))

    async def _call(self, coro: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(coro, self._timeout)
        except IndexUnavailable:
            raise
        except Exception as exc:
            raise unavailable(self.name, exc) from exc

    async def _exists(self, collection: str) -> bool:
        if collection in self._known:
            return True
        if await self._call(self._client.collection_exists(collection)):
            self._known.add(collection)
            return True
        return False

    async def _ensure(self, collection: str, size: int) -> None:
        if collection in self._known:
            return
        async with self._create_lock:
            if await self._exists(collection):
                return
            await self._call(
                self._client.create_collection(
                    collection, vectors_config=models.VectorParams(size=size, distance=models.Distance.COSINE)
                )
            )
            for key, kind in PAYLOAD_INDEXES:
                await self._call(self._client.create_payload_index(collection, key, field_schema=_SCHEMAS[kind]))
            self._known.add(collection)

    async def upsert(self, collection: str, points: Sequence[IndexPoint]) -> None:
        if not points:
            return
        await self._ensure(collection, int(points[0].vector.shape[0]))
        await self._call(
            self._client.upsert(
                collection,
                points=[
                    models.PointStruct(id=pid, vector=values, payload=payload)
                    for pid, values, payload in map(wire_point, points)
                ],
                wait=True,
            )
        )

    async def prepare(self, collection: str, dimensions: int) -> None:
        await self._ensure(collection, dimensions)

    async def delete(self, collection: str, ids: Sequence[uuid.UUID]) -> None:
        if not ids or not await self._exists(collection):
            return
        await self._call(
            self._client.delete(collection, points_selector=models.PointIdsList(points=[str(i) for i in ids]))
        )

    async def _nearest(self, collection: str, query: np.ndarray, scope: SearchScope, limit: int) -> list[IndexHit]:
        if not await self._exists(collection):
            return []
        must: list[models.Condition] = [
            models.FieldCondition(key=k, match=models.MatchValue(value=v)) for k, v in scope.matches()
        ]
        must.append(models.FieldCondition(key="expire_at", range=models.Range(gt=scope.now)))
        resp = await self._call(
            self._client.query_points(
                collection,
                query=query.tolist(),
                query_filter=models.Filter(must=must),
                limit=limit,
                with_payload=False,
            )
        )
        return hits(resp.points)

    async def reset(self, collection: str) -> None:
        if await self._exists(collection):
            await self._call(self._client.delete_collection(collection))
        self._known.discard(collection)

    async def count(self, collection: str) -> int:
        if not await self._exists(collection):
            return 0
        return int((await self._call(self._client.count(collection, exact=True))).count)

    async def collections(self) -> list[str]:
        resp = await self._call(self._client.get_collections())
        return sorted(c.name for c in resp.collections)

    async def point_ids(self, collection: str, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        if not await self._exists(collection):
            return []
        offset, ask = page_request(after, limit)
        points, _next = await self._call(
            self._client.scroll(collection, offset=offset, limit=ask, with_payload=False, with_vectors=False)
        )
        return scroll_page(points, after, limit)

    async def close(self) -> None:
        await self._client.close()
