"""The knowledge pages' background passes: the vector fill, pending indexing, and the index rebuild.

A page stored without a vector (the inline embed failed or timed out, or no embedder was wired
when it was written) is embedded by the shared vector fill (``libs.common.fill``), its container
standing where the diary has a seat. ``knowledge_pass_specs`` is what the prefetch bootstrap adds
to its component (``knowledge-fill``), and ``rebuild_index`` restores the ``knowledge_pages``
collections from the vectors Postgres keeps, without one embedding call. All are idempotent.
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
from libs.common.fill import FillRow, VectorFill
from libs.common.passrunner import PassSpec
from libs.common.vectorindex import IndexUnavailable, collection_name
from services.prefetch.knowledge.domain import COLLECTION_BASE, embedding_text
from services.prefetch.knowledge.service import KnowledgeService, index_point

__all__ = ["KnowledgeFillSource", "index_pending", "knowledge_pass_specs", "rebuild_index"]

_log = logging.getLogger(__name__)


async def index_pending(service: KnowledgeService, batch: int = 1000) -> int:
    """Index pages whose vector is stored but not yet in the index (the index was down)."""
    done = 0
    while True:
        rows = await service.store.unindexed(batch)
        if not rows:
            return done
        by_dims: dict[int, list] = defaultdict(list)
        for r in rows:
            vec = as_array(r["embedding"])
            by_dims[vec.shape[0]].append(index_point(r["id"], r["company"], r["container"], vec, r["embedding_model"]))
        try:
            for dims, points in by_dims.items():
                await service.index.upsert(collection_name(COLLECTION_BASE, dims), points)
        except IndexUnavailable as err:
            _log.warning("index still unreachable; %d pages wait to be indexed: %s", len(rows), err)
            return done
        await service.store.set_indexed([r["id"] for r in rows])
        done += len(rows)


async def rebuild_index(service: KnowledgeService, batch: int = 1000) -> int:
    """Restore the index from the vectors Postgres keeps: no embedding call at all."""
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
            vec = as_array(r["embedding"])
            dims = vec.shape[0]
            if dims not in dims_seen:
                await service.index.reset(collection_name(COLLECTION_BASE, dims))
                dims_seen.add(dims)
            by_dims[dims].append(index_point(r["id"], r["company"], r["container"], vec, r["embedding_model"]))
        for dims, points in by_dims.items():
            await service.index.upsert(collection_name(COLLECTION_BASE, dims), points)
        await service.store.set_indexed([r["id"] for r in rows])
        total += len(rows)
        after = rows[-1]["id"]
    return total


class KnowledgeFillSource:
    """The pages as the shared fill sees them: a container stands where a seat would."""

    name = "knowledge"

    _PENDING = """
        (embedding IS NULL OR embedding_model IS DISTINCT FROM $3
         OR ($4::int IS NOT NULL AND embedding_dims IS DISTINCT FROM $4))
        AND NOT (fill_held_until IS NOT NULL AND fill_held_until > $2 AND fill_held_fingerprint = $5)"""

    def __init__(self, service: KnowledgeService):
        self._service = service
        self._pool: asyncpg.Pool = service.store.pool

    async def companies(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT DISTINCT company FROM knowledge_pages WHERE $1::text IS NULL AND {self._PENDING} ORDER BY company",
            None,
            now,
            model,
            dims,
            fingerprint,
        )
        return [r["company"] for r in rows]

    async def seats(self, company: str, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        rows = await self._pool.fetch(
            f"SELECT DISTINCT container FROM knowledge_pages WHERE company = $1 AND {self._PENDING} ORDER BY container",
            company,
            now,
            model,
            dims,
            fingerprint,
        )
        return [r["container"] for r in rows]

    async def pending(
        self, company: str, seat: str, model: str, dims: int | None, fingerprint: str, now: datetime, limit: int
    ) -> list[FillRow]:
        rows = await self._pool.fetch(
            f"""SELECT id, title, body, fill_alone AND fill_held_fingerprint = $5 AS alone FROM knowledge_pages
                WHERE company = $1 AND container = $6 AND {self._PENDING}
                ORDER BY update_time, id LIMIT $7""",
            company,
            now,
            model,
            dims,
            fingerprint,
            seat,
            limit,
        )
        return [FillRow(r["id"], company, seat, embedding_text(r["title"], r["body"]), bool(r["alone"])) for r in rows]

    async def store_vector(self, row: FillRow, vector: Vector) -> None:
        # Only while the page still has the text the vector is of: a rewrite meanwhile keeps its own.
        rec = await self._pool.fetchrow(
            """UPDATE knowledge_pages SET embedding = $2, embedding_model = $3, embedding_dims = $4, indexed = false,
                   fill_held_until = NULL, fill_held_fingerprint = NULL, fill_alone = false
               WHERE id = $1 AND title || E'\\n\\n' || body = $5 RETURNING company, container""",
            row.id,
            vector.values.astype(np.float32),
            vector.model,
            vector.dimensions,
            row.text,
        )
        if rec is None:
            return  # deleted or rewritten meanwhile
        try:
            await self._service.index.upsert(
                collection_name(COLLECTION_BASE, vector.dimensions),
                [index_point(row.id, rec["company"], rec["container"], vector.values, vector.model)],
            )
        except IndexUnavailable as err:
            _log.warning("filled page %s waits for the index: %s", row.id, err)
            return
        await self._service.store.set_indexed([row.id])

    async def hold(self, row: FillRow, until: datetime, fingerprint: str, alone: bool) -> None:
        await self._pool.execute(
            """UPDATE knowledge_pages SET fill_held_until = $2, fill_held_fingerprint = $3, fill_alone = $4
               WHERE id = $1""",
            row.id,
            until,
            fingerprint,
            alone,
        )


def knowledge_pass_specs(service: KnowledgeService, infra) -> list[PassSpec]:  # type: ignore[no-untyped-def]
    """``knowledge-fill``: index what waits for the index, then embed what has no vector."""
    filler = None
    if infra.embedder is not None:
        filler = VectorFill(
            infra.pool,
            [KnowledgeFillSource(service)],
            infra.embedder,
            infra.settings.learning.fill,
            infra.settings.providers.embeddings,
            infra.clock,
            infra.events,
        )

    async def run_fill() -> object:
        indexed = await index_pending(service)
        report = await filler.run_minute() if filler else None
        return {"indexed": indexed, "fill": report}

    return [PassSpec("knowledge-fill", run_fill, infra.settings.learning.fill.interval_seconds)]
