"""The episodes' index passes and their vector fill: index what waits for the index, rebuild the
index from Postgres, and the fill's view of the table (raw rows only).

``services.runner`` wraps each in a lease claim (``episode-fill``; the lifecycle is
``episode-lifecycle``, in ``lifecycle.py``), the all-in-one ticks it on its cadence, and a
Kubernetes CronJob runs it as ``./run pass <name>``. All are idempotent.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import datetime

import asyncpg
import numpy as np

from libs.common.db import as_array
from libs.common.embeddings import Vector
from libs.common.fill import FillRow
from libs.common.vectorindex import IndexUnavailable, collection_name
from services.episodes.domain import COLLECTION_BASE, vector_text
from services.episodes.service import EpisodeService, index_point

__all__ = ["EpisodeFillSource", "index_pending", "rebuild_index"]

_log = logging.getLogger(__name__)


def _point(r: asyncpg.Record):  # type: ignore[no-untyped-def]
    return index_point(r["id"], r["company"], r["seat"], r["outcome"], as_array(r["embedding"]), r["embedding_model"])


async def index_pending(service: EpisodeService, batch: int = 1000) -> int:
    """Index rows whose vector is stored but not yet in the index (the index was down)."""
    done = 0
    while True:
        rows = await service.store.unindexed(batch)
        if not rows:
            return done
        by_dims: dict[int, list] = defaultdict(list)
        for r in rows:
            point = _point(r)
            by_dims[point.vector.shape[0]].append(point)
        try:
            for dims, points in by_dims.items():
                await service.index.upsert(collection_name(COLLECTION_BASE, dims), points)
        except IndexUnavailable as err:
            _log.warning("index still unreachable; %d episodes wait to be indexed: %s", len(rows), err)
            return done
        await service.store.set_indexed([r["id"] for r in rows])
        done += len(rows)


async def rebuild_index(service: EpisodeService, batch: int = 1000) -> int:
    """Restore the index from the vectors Postgres keeps (raw rows only): no embedding call."""
    dims_seen: set[int] = set()
    await service.store.clear_indexed()
    after: uuid.UUID | None = None
    total = 0
    while True:
        rows = await service.store.vectors_page(after, batch)
        if not rows:
            break
        by_dims: dict[int, list] = defaultdict(list)
        for r in rows:
            point = _point(r)
            dims = point.vector.shape[0]
            if dims not in dims_seen:
                await service.index.reset(collection_name(COLLECTION_BASE, dims))
                dims_seen.add(dims)
            by_dims[dims].append(point)
        for dims, points in by_dims.items():
            await service.index.upsert(collection_name(COLLECTION_BASE, dims), points)
        await service.store.set_indexed([r["id"] for r in rows])
        total += len(rows)
        after = rows[-1]["id"]
    return total


class EpisodeFillSource:
    """Raw episodes as the shared fill sees them: the text is the row's own vector text, so a long
    ask goes a request at a time across minutes (``libs.common.fill``). Compacted rows are never
    offered: they are never embedded."""

    name = "episodes"

    # No vector of (model, width) and not held under the provider's fingerprint. The model test is
    # written as ranges (NULL, below, above) so a minute with nothing to fill reads episodes_fill
    # rather than the table.
    _PENDING = """
        kind = 'raw'
        AND (embedding_model IS NULL OR embedding_model < $2 OR embedding_model > $2
             OR (embedding_model = $2 AND $3::int IS NOT NULL AND (embedding_dims < $3 OR embedding_dims > $3)))
        AND NOT (fill_held_until IS NOT NULL AND fill_held_until > $4 AND fill_held_fingerprint = $5)"""

    def __init__(self, service: EpisodeService):
        self._service = service
        self._pool: asyncpg.Pool = service.store.pool

    async def companies(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT DISTINCT company FROM episodes WHERE $1::text IS NULL AND {self._PENDING} ORDER BY company",
            None,
            model,
            dims,
            now,
            fingerprint,
        )
        return [r["company"] for r in rows]

    async def seats(self, company: str, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT DISTINCT seat FROM episodes WHERE company = $1 AND {self._PENDING} ORDER BY seat",
            company,
            model,
            dims,
            now,
            fingerprint,
        )
        return [r["seat"] for r in rows]

    async def pending(
        self, company: str, seat: str, model: str, dims: int | None, fingerprint: str, now: datetime, limit: int
    ) -> list[FillRow]:
        rows = await self._pool.fetch(
            f"""SELECT id, label, ask, what_it_did, fill_alone AND fill_held_fingerprint = $5 AS alone FROM episodes
                WHERE company = $1 AND seat = $6 AND {self._PENDING}
                ORDER BY end_time, id LIMIT $7""",
            company,
            model,
            dims,
            now,
            fingerprint,
            seat,
            limit,
        )
        return [
            FillRow(r["id"], company, seat, vector_text(r["label"], r["ask"], r["what_it_did"]), bool(r["alone"]))
            for r in rows
        ]

    async def store_vector(self, row: FillRow, vector: Vector) -> None:
        rec = await self._pool.fetchrow(
            """UPDATE episodes SET embedding = $2, embedding_model = $3, embedding_dims = $4, indexed = false,
                   fill_held_until = NULL, fill_held_fingerprint = NULL, fill_alone = false
               WHERE id = $1 AND kind = 'raw' RETURNING company, seat, outcome""",
            row.id,
            vector.values.astype(np.float32),
            vector.model,
            vector.dimensions,
        )
        if rec is None:
            return  # deleted meanwhile (the lifecycle dropped or folded it)
        try:
            await self._service.index.upsert(
                collection_name(COLLECTION_BASE, vector.dimensions),
                [index_point(row.id, rec["company"], rec["seat"], rec["outcome"], vector.values, vector.model)],
            )
        except IndexUnavailable as err:
            _log.warning("filled episode %s waits for the index: %s", row.id, err)
            return
        await self._service.store.set_indexed([row.id])

    async def hold(self, row: FillRow, until: datetime, fingerprint: str, alone: bool) -> None:
        await self._pool.execute(
            """UPDATE episodes SET fill_held_until = $2, fill_held_fingerprint = $3, fill_alone = $4
               WHERE id = $1""",
            row.id,
            until,
            fingerprint,
            alone,
        )
