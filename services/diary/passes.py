"""The diary's background passes: the retention sweep, the vector fill, and the index rebuild.

Each is a one-shot function; ``services.runner`` wraps it in a lease claim (``diary-sweep``,
``diary-fill``), the all-in-one ticks it on its cadence, and a Kubernetes CronJob runs it as
``./run pass <name>``. All are idempotent: a pass started twice does the work once.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import numpy as np

from libs.common.db import as_array
from libs.common.embeddings import Vector
from libs.common.fill import FillRow
from libs.common.vectorindex import IndexUnavailable, VectorIndex, collection_name
from services.diary.domain import COLLECTION_BASE
from services.diary.service import DiaryService, index_point

__all__ = ["DiaryFillSource", "SweepReport", "index_pending", "rebuild_index", "sweep"]

_log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    expired_deleted: int = 0
    evicted_over_cap: int = 0
    seats_over_cap: int = 0


async def _drop_points(index: VectorIndex, gone: list[tuple[uuid.UUID, int | None]]) -> None:
    by_dims: dict[int, list[uuid.UUID]] = defaultdict(list)
    for note_id, dims in gone:
        if dims:
            by_dims[dims].append(note_id)
    for dims, ids in by_dims.items():
        try:
            await index.delete(collection_name(COLLECTION_BASE, dims), ids)
        except IndexUnavailable as err:
            _log.warning("%d swept notes keep stale points until a rebuild: %s", len(ids), err)


async def sweep(service: DiaryService) -> SweepReport:
    """Delete SHORT notes past their TTL; evict LONG notes past the per-seat cap by use."""
    report = SweepReport()
    now = service.clock.now()
    while True:
        gone = await service.store.sweep_expired(now)
        if not gone:
            break
        report.expired_deleted += len(gone)
        await _drop_points(service.index, gone)
    cap = service.config.long_cap_per_seat
    for company, seat in await service.store.seats_over_cap(cap):
        report.seats_over_cap += 1
        gone = await service.store.evict_over_cap(company, seat, cap)
        report.evicted_over_cap += len(gone)
        await _drop_points(service.index, gone)
        await service.events.emit("diary_evicted_over_cap", company=company, seat=seat, evicted=len(gone), cap=cap)
    await service.events.emit(
        "diary_sweep_completed",
        expired_deleted=report.expired_deleted,
        evicted_over_cap=report.evicted_over_cap,
        seats_over_cap=report.seats_over_cap,
    )
    return report


async def index_pending(service: DiaryService, batch: int = 1000) -> int:
    """Index notes whose vector is stored but not yet in the index (the index was down)."""
    done = 0
    while True:
        rows = await service.store.unindexed(service.clock.now(), batch)
        if not rows:
            return done
        by_dims: dict[int, list] = defaultdict(list)
        for r in rows:
            vec = as_array(r["embedding"])
            by_dims[vec.shape[0]].append(
                index_point(r["id"], r["company"], r["seat"], vec, r["embedding_model"], r["expire_time"])
            )
        try:
            for dims, points in by_dims.items():
                await service.index.upsert(collection_name(COLLECTION_BASE, dims), points)
        except IndexUnavailable as err:
            _log.warning("index still unreachable; %d notes wait to be indexed: %s", len(rows), err)
            return done
        await service.store.set_indexed([r["id"] for r in rows])
        done += len(rows)


async def rebuild_index(service: DiaryService, batch: int = 1000) -> int:
    """Restore the index from the vectors Postgres keeps: no embedding call at all."""
    dims_seen: set[int] = set()
    await service.store.clear_indexed()
    after: uuid.UUID | None = None
    total = 0
    while True:
        rows = await service.store.vectors_page(service.clock.now(), after, batch)
        if not rows:
            break
        by_dims: dict[int, list] = defaultdict(list)
        for r in rows:
            vec = as_array(r["embedding"])
            dims = vec.shape[0]
            if dims not in dims_seen:
                await service.index.reset(collection_name(COLLECTION_BASE, dims))
                dims_seen.add(dims)
            by_dims[dims].append(
                index_point(r["id"], r["company"], r["seat"], vec, r["embedding_model"], r["expire_time"])
            )
        for dims, points in by_dims.items():
            await service.index.upsert(collection_name(COLLECTION_BASE, dims), points)
        await service.store.set_indexed([r["id"] for r in rows])
        total += len(rows)
        after = rows[-1]["id"]
    return total


class DiaryFillSource:
    """The diary's rows as the shared fill sees them."""

    name = "diary"

    _PENDING = """
        (expire_time IS NULL OR expire_time > $2)
        AND (embedding IS NULL OR embedding_model IS DISTINCT FROM $3
             OR ($4::int IS NOT NULL AND embedding_dims IS DISTINCT FROM $4))
        AND NOT (fill_held_until IS NOT NULL AND fill_held_until > $2 AND fill_held_fingerprint = $5)"""

    def __init__(self, service: DiaryService):
        self._service = service
        self._pool: asyncpg.Pool = service.store.pool

    async def companies(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT DISTINCT company FROM agent_diary WHERE $1::text IS NULL AND {self._PENDING} ORDER BY company",
            None,
            now,
            model,
            dims,
            fingerprint,
        )
        return [r["company"] for r in rows]

    async def seats(self, company: str, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT DISTINCT seat FROM agent_diary WHERE company = $1 AND {self._PENDING} ORDER BY seat",
            company,
            now,
            model,
            dims,
            fingerprint,
        )
        return [r["seat"] for r in rows]

    async def pending(
        self, company: str, seat: str, model: str, dims: int | None, fingerprint: str, now: datetime, limit: int
    ) -> list[FillRow]:
        rows = await self._pool.fetch(
            f"""SELECT id, content, fill_alone AND fill_held_fingerprint = $5 AS alone FROM agent_diary
                WHERE company = $1 AND seat = $6 AND {self._PENDING}
                ORDER BY create_time, id LIMIT $7""",
            company,
            now,
            model,
            dims,
            fingerprint,
            seat,
            limit,
        )
        return [FillRow(r["id"], company, seat, r["content"], bool(r["alone"])) for r in rows]

    async def store_vector(self, row: FillRow, vector: Vector) -> None:
        rec = await self._pool.fetchrow(
            """UPDATE agent_diary SET embedding = $2, embedding_model = $3, embedding_dims = $4, indexed = false,
                   fill_held_until = NULL, fill_held_fingerprint = NULL, fill_alone = false
               WHERE id = $1 RETURNING company, seat, expire_time""",
            row.id,
            vector.values.astype(np.float32),
            vector.model,
            vector.dimensions,
        )
        if rec is None:
            return  # deleted meanwhile
        try:
            await self._service.index.upsert(
                collection_name(COLLECTION_BASE, vector.dimensions),
                [index_point(row.id, rec["company"], rec["seat"], vector.values, vector.model, rec["expire_time"])],
            )
        except IndexUnavailable as err:
            _log.warning("filled note %s waits for the index: %s", row.id, err)
            return
        await self._service.store.set_indexed([row.id])

    async def hold(self, row: FillRow, until: datetime, fingerprint: str, alone: bool) -> None:
        await self._pool.execute(
            """UPDATE agent_diary SET fill_held_until = $2, fill_held_fingerprint = $3, fill_alone = $4
               WHERE id = $1""",
            row.id,
            until,
            fingerprint,
            alone,
        )
