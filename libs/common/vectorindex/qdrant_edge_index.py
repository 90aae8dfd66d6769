"""Qdrant's engine in-process (``qdrant-edge-py``): one shard per collection under a directory.

The SDK is synchronous, so every call runs in a worker thread; a lock per shard keeps one
operation at a time on it. Shards persist and reopen across restarts.

A shard is open in the process that loaded it, so another process deleting or rewriting its files
(``./run rebuild-index`` while the all-in-one serves) leaves the server on files that are gone and
the two copies out of step. So every opener holds a lock on ``<root>/.lock`` for its life: shared
by servers and passes (split mode runs one process per service on the same directory), exclusive by
``./run rebuild-index`` (:func:`exclusive_edge_index`), and each refuses in one line while the other
kind is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, overload

import numpy as np

from libs.common.vectorindex._port import IndexHit, IndexPoint, IndexUnavailable, SearchScope, VectorIndex
from libs.common.vectorindex._qdrant import PAYLOAD_INDEXES, hits, page_request, scroll_page, unavailable, wire_point

if TYPE_CHECKING:
    from qdrant_edge import ConditionType, EdgeShard

__all__ = ["EdgeIndexInUse", "QdrantEdgeIndex", "exclusive_edge_index"]

T = TypeVar("T")
LOCK_FILE = ".lock"
# Roots this process holds exclusively (rebuild-index): its own adapter opens them without a lock
# of its own (a second flock on another descriptor would conflict with the process's own).
_EXCLUSIVE: dict[Path, int] = {}


class EdgeIndexInUse(RuntimeError):
    """Another process holds the embedded index in a way this one cannot share: a one-line reason."""


def _lock(root: Path, mode: int) -> int:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def exclusive_edge_index(root: Path) -> Iterator[None]:
    """Hold the embedded index at ``root`` alone for the block: what ``./run rebuild-index`` needs
    before it empties and refills the collections. Refuses while any server or pass has it open."""
    key = Path(root).resolve()
    try:
        fd = _lock(key, fcntl.LOCK_EX)
    except BlockingIOError:
        raise EdgeIndexInUse(
            f"the embedded vector index at {root} is open in another process (a running ./run up or "
            "serve, or a pass): stop the server first, or run with a Qdrant server (qdrant_url), where "
            "rebuild-index runs while serving"
        ) from None
    _EXCLUSIVE[key] = fd
    try:
        yield
    finally:
        del _EXCLUSIVE[key]
        os.close(fd)


class QdrantEdgeIndex(VectorIndex):
    name = "qdrant-edge"

    def __init__(self, root: Path):
        self._root = Path(root)
        self._shards: dict[str, EdgeShard] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._registry = threading.Lock()
        self._closed = False
        self._lock_fd: int | None = None
        if self._root.resolve() not in _EXCLUSIVE:
            try:
                self._lock_fd = _lock(self._root, fcntl.LOCK_SH)
            except BlockingIOError:
                raise EdgeIndexInUse(
                    f"the embedded vector index at {self._root} is being rebuilt by another process "
                    "(./run rebuild-index): start again when it has finished"
                ) from None

    def _path(self, collection: str) -> Path:
        return self._root / collection

    @overload
    def _open(self, collection: str, size: int) -> EdgeShard: ...
    @overload
    def _open(self, collection: str, size: None) -> EdgeShard | None: ...
    def _open(self, collection: str, size: int | None) -> EdgeShard | None:
        """The shard of ``collection``: open, load from disk, or (given a size) create it."""
        from qdrant_edge import (
            Distance,
            EdgeConfig,
            EdgeShard,
            EdgeVectorParams,
            FloatIndexParams,
            KeywordIndexParams,
            UpdateOperation,
        )

        with self._registry:
            if self._closed:
                raise IndexUnavailable("qdrant-edge index is closed")
            shard = self._shards.get(collection)
            if shard is not None:
                return shard
            path = self._path(collection)
            if path.exists() and any(path.iterdir()):
                shard = EdgeShard.load(str(path))
            elif size is None:
                return None
            else:
                path.mkdir(parents=True, exist_ok=True)
                shard = EdgeShard.create(
                    str(path), EdgeConfig(vectors=EdgeVectorParams(size=size, distance=Distance.Cosine))
                )
                schemas: dict[str, KeywordIndexParams | FloatIndexParams] = {
                    "tenant": KeywordIndexParams(is_tenant=True),
                    "keyword": KeywordIndexParams(),
                    "float": FloatIndexParams(),
                }
                for key, kind in PAYLOAD_INDEXES:
                    shard.update(UpdateOperation.create_field_index(key, schemas[kind]))
            self._shards[collection] = shard
            self._locks[collection] = threading.Lock()
            return shard

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except IndexUnavailable:
            raise
        except Exception as exc:
            raise unavailable(self.name, exc) from exc

    async def upsert(self, collection: str, points: Sequence[IndexPoint]) -> None:
        if not points:
            return
        from qdrant_edge import Point, UpdateOperation

        def work() -> None:
            shard = self._open(collection, int(points[0].vector.shape[0]))
            batch = [Point(*wire_point(p)) for p in points]
            with self._locks[collection]:
                shard.update(UpdateOperation.upsert_points(batch))

        await self._run(work)

    async def prepare(self, collection: str, dimensions: int) -> None:
        await self._run(lambda: self._open(collection, dimensions))

    async def delete(self, collection: str, ids: Sequence[uuid.UUID]) -> None:
        if not ids:
            return
        from qdrant_edge import UpdateOperation

        def work() -> None:
            shard = self._open(collection, None)
            if shard is None:
                return
            with self._locks[collection]:
                shard.update(UpdateOperation.delete_points([str(i) for i in ids]))

        await self._run(work)

    async def _nearest(self, collection: str, query: np.ndarray, scope: SearchScope, limit: int) -> list[IndexHit]:
        from qdrant_edge import FieldCondition, Filter, MatchValue, Query, QueryRequest, RangeFloat

        must: list[ConditionType] = [FieldCondition(k, match=MatchValue(v)) for k, v in scope.matches()]
        must.append(FieldCondition("expire_at", range=RangeFloat(gt=scope.now)))
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest(query.tolist()),
            filter=Filter(must=must),
            with_payload=False,
        )

        def work() -> list[IndexHit]:
            shard = self._open(collection, None)
            if shard is None:
                return []
            with self._locks[collection]:
                points = shard.query(request)
            return hits(points)

        return await self._run(work)

    async def reset(self, collection: str) -> None:
        def work() -> None:
            with self._registry:
                shard = self._shards.pop(collection, None)
                self._locks.pop(collection, None)
            if shard is not None:
                shard.close()
            shutil.rmtree(self._path(collection), ignore_errors=True)

        await self._run(work)

    async def count(self, collection: str) -> int:
        from qdrant_edge import CountRequest

        def work() -> int:
            shard = self._open(collection, None)
            if shard is None:
                return 0
            with self._locks[collection]:
                return int(shard.count(CountRequest(exact=True)))

        return await self._run(work)

    async def collections(self) -> list[str]:
        def work() -> list[str]:
            if not self._root.exists():
                return []
            return sorted(p.name for p in self._root.iterdir() if p.is_dir() and any(p.iterdir()))

        return await self._run(work)

    async def point_ids(self, collection: str, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        from qdrant_edge import ScrollRequest

        def work() -> list[uuid.UUID]:
            shard = self._open(collection, None)
            if shard is None:
                return []
            offset, ask = page_request(after, limit)
            with self._locks[collection]:
                points, _next = shard.scroll(ScrollRequest(offset=offset, limit=ask, with_payload=False))
            return scroll_page(points, after, limit)

        return await self._run(work)

    def optimize(self) -> None:
        """Build HNSW for every open shard (benchmarks; the engine also optimises on its own)."""
        with self._registry:
            shards = list(self._shards.items())
        for name, shard in shards:
            with self._locks[name]:
                shard.optimize()

    async def close(self) -> None:
        def work() -> None:
            with self._registry:
                self._closed = True
                shards = list(self._shards.values())
                self._shards.clear()
            for shard in shards:
                shard.flush()
                shard.close()
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                os.close(fd)  # releases the lock: the shards are flushed and closed

        await asyncio.to_thread(work)
