"""The one vector read/write path of the tables that keep their own vector (diary notes, raw
episodes, knowledge pages):

* write: :func:`embed_inline` (the write's budgeted embed: a vector, or none and why — the fill
  tries again later) and :func:`index_row` (the new row's point; when the index cannot be reached
  the row keeps its vector and ``indexed = false``, and ``index_pending`` puts it in later);
* read: :func:`embed_query` (the query's vector and its :class:`EmbeddingStatus`) and
  :func:`vector_half` — the index's top K for each seat (or container), or, when the index cannot
  answer, the store's exact scan of the same rows; every index hit is re-read from Postgres, so a
  deleted or expired row's stale point is never returned; the exact scan too when the index
  answered but rows of the scope wait to be indexed (written while it was down: its answer would
  miss them); hits under the relevance floor dropped; and how many live rows the vector half cannot
  see (no vector of the query's model yet).

What differs per table is given as arguments: the collection, the point filters, and a
:class:`RowReads` bound to one request's scope (its exact scan and its re-read).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

import numpy as np

from agentlearn.common.v1 import embedding_pb2
from libs.common.embeddings import Embedder, Vector, embed_within
from libs.common.vectorindex import IndexHit, IndexPoint, IndexUnavailable, VectorIndex, collection_name

__all__ = [
    "EmbeddingStatus",
    "InlineEmbedding",
    "QueryEmbedding",
    "RowReads",
    "VectorHalf",
    "VectorSource",
    "embed_inline",
    "embed_query",
    "embedding_status_to_pb",
    "index_row",
    "vector_half",
    "vector_source_to_pb",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class EmbeddingStatus(StrEnum):
    """What became of the query's vector (the proto's ``agentlearn.common.v1.EmbeddingStatus``)."""

    EMBEDDED = "embedded"
    PROVIDED = "provided"  # the caller sent it
    FAILED = "failed"
    UNCONFIGURED = "unconfigured"
    SKIPPED = "skipped"  # nothing to embed (a blank query, or no vector half asked for)


class VectorSource(StrEnum):
    """Which path answered the vector half (the proto's ``agentlearn.common.v1.VectorSource``)."""

    INDEX = "index"
    EXACT_SCAN = "exact_scan"
    """Postgres scanned the rows' own vectors: the index was unreachable, or it answered while rows
    of the scope were not in it yet (written while it was down; the index pass puts them in)."""


_STATUS_TO_PB = {
    EmbeddingStatus.EMBEDDED: embedding_pb2.EMBEDDING_STATUS_EMBEDDED,
    EmbeddingStatus.PROVIDED: embedding_pb2.EMBEDDING_STATUS_PROVIDED,
    EmbeddingStatus.FAILED: embedding_pb2.EMBEDDING_STATUS_FAILED,
    EmbeddingStatus.UNCONFIGURED: embedding_pb2.EMBEDDING_STATUS_UNCONFIGURED,
    EmbeddingStatus.SKIPPED: embedding_pb2.EMBEDDING_STATUS_SKIPPED,
}
_SOURCE_TO_PB = {
    None: embedding_pb2.VECTOR_SOURCE_UNSPECIFIED,
    VectorSource.INDEX: embedding_pb2.VECTOR_SOURCE_INDEX,
    VectorSource.EXACT_SCAN: embedding_pb2.VECTOR_SOURCE_EXACT_SCAN,
}


def embedding_status_to_pb(status: EmbeddingStatus) -> embedding_pb2.EmbeddingStatus:
    return _STATUS_TO_PB[status]


def vector_source_to_pb(source: VectorSource | None) -> embedding_pb2.VectorSource:
    """None (no vector half ran) is ``VECTOR_SOURCE_UNSPECIFIED``."""
    return _SOURCE_TO_PB[source]


# ---------------------------------------------------------------------------------------- write


@dataclass(frozen=True)
class InlineEmbedding:
    """A written row's vector, or none and why (``unconfigured``, ``timeout``, a provider error's
    kind, ``unusable_vector``): the row is stored either way and the fill embeds it later."""

    vector: Vector | None
    skipped_reason: str | None = None

    @property
    def values(self) -> np.ndarray | None:
        return self.vector.values if self.vector is not None else None

    @property
    def model(self) -> str | None:
        return self.vector.model if self.vector is not None else None


async def embed_inline(embedder: Embedder | None, text: str, budget_seconds: float) -> InlineEmbedding:
    """The write's embed, within its budget (the diary's two seconds)."""
    vec, reason = await embed_within(embedder, text, budget_seconds)
    return InlineEmbedding(vec, reason)


async def index_row(
    index: VectorIndex,
    collection_base: str,
    point: IndexPoint,
    set_indexed: Callable[[Sequence[uuid.UUID]], Awaitable[object]],
    what: str,
) -> bool:
    """Upsert a stored row's point and mark the row indexed. When the index cannot be reached the
    row keeps its vector and stays ``indexed = false`` (the index pass puts it in later): returns
    False, never raises ``IndexUnavailable``."""
    try:
        await index.upsert(collection_name(collection_base, int(point.vector.shape[0])), [point])
    except IndexUnavailable as err:
        _log.warning("%s %s stored but not indexed: %s", what, point.id, err)
        return False
    await set_indexed([point.id])
    return True


# ----------------------------------------------------------------------------------------- read


@dataclass(frozen=True)
class QueryEmbedding:
    """The query's vector (None: no vector half runs) and what became of it."""

    vector: Vector | None
    status: EmbeddingStatus
    reason: str | None = None
    """Why it has none, when the embed failed (``timeout``, a provider error's kind, ...)."""

    @classmethod
    def provided(cls, vector: Vector) -> QueryEmbedding:
        return cls(vector, EmbeddingStatus.PROVIDED)

    @classmethod
    def skipped(cls) -> QueryEmbedding:
        return cls(None, EmbeddingStatus.SKIPPED)


async def embed_query(embedder: Embedder | None, query: str, budget_seconds: float) -> QueryEmbedding:
    """The query's vector within the turn's budget, through the query cache. A blank query is
    skipped when an embedder is configured (there is nothing to embed), else unconfigured."""
    if embedder is not None and not query.strip():
        return QueryEmbedding.skipped()
    vec, reason = await embed_within(embedder, query, budget_seconds, query=True)
    if vec is None:
        status = EmbeddingStatus.UNCONFIGURED if reason == "unconfigured" else EmbeddingStatus.FAILED
        return QueryEmbedding(None, status, reason)
    return QueryEmbedding(vec, EmbeddingStatus.EMBEDDED)


class RowReads(Protocol[T_co]):
    """One request's reads of the table behind the vector half (bound to its company, seat or
    containers, time and filters): the exact scan and the re-read of index hits."""

    async def exact(self, vector: np.ndarray, model: str, limit: int) -> Sequence[tuple[T_co, float]]:
        """The top ``limit`` live rows by cosine to ``vector`` among those whose vector is of ``model``
        (the fallback when the index cannot answer)."""
        ...

    async def hydrate(self, ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, T_co]:
        """The rows of these ids still live and in scope; a missing id is a stale point."""
        ...


@dataclass(frozen=True)
class VectorHalf(Generic[T]):
    """What the vector half found: rows with their cosine similarity, best first."""

    status: EmbeddingStatus
    source: VectorSource | None = None
    """None: no vector half ran (no query vector)."""
    hits: list[tuple[T, float]] = field(default_factory=list)
    unreachable: int = 0
    """Live rows of the scope the vector half cannot see (no vector of the query's model yet)."""
    floor: float | None = None
    """The relevance floor the hits were held to (None: none)."""


async def vector_half(
    query: QueryEmbedding,
    index: VectorIndex | None,
    collection_base: str,
    reads: RowReads[T],
    *,
    company: str,
    seats: Sequence[str],
    now: float,
    limit: int,
    labels: Mapping[str, str] | None = None,
    floor: Callable[[str], float | None] | None = None,
    unreachable: Callable[[Vector], Awaitable[int]] | None = None,
    unindexed: Callable[[Vector], Awaitable[int]] | None = None,
) -> VectorHalf[T]:
    """Top ``limit`` rows by similarity to the query's vector among ``seats`` (one search per seat,
    concurrently; a row's best score), re-read through ``reads``; the exact scan when the index is
    missing or any search cannot answer. ``floor`` maps the query's model to its relevance floor;
    ``unreachable`` counts the rows the half cannot see. ``unindexed`` counts the live rows of the
    scope with a vector of the query's model the index does not hold yet (``indexed = false``):
    asked after the re-read, so a store answers it in that same statement; when there are any, the
    index's answer would miss them and the exact scan (which reads every row's own vector) answers
    instead, until the index pass has put them in. Errors other than ``IndexUnavailable``
    propagate."""
    vector = query.vector
    if vector is None:
        return VectorHalf(query.status)
    values, model = vector.values, vector.model
    answers: list[list[IndexHit] | BaseException] = []
    failed: BaseException | None = None
    if index is None:
        failed = IndexUnavailable("no vector index wired")
    else:
        collection = collection_name(collection_base, int(values.shape[0]))
        if len(seats) == 1:  # the common case without a gather's task overhead
            try:
                answers = [
                    await index.search(
                        collection,
                        values,
                        company=company,
                        seat=seats[0],
                        model=model,
                        now=now,
                        limit=limit,
                        labels=labels,
                    )
                ]
            except IndexUnavailable as err:
                failed = err
        else:
            answers = await asyncio.gather(
                *(
                    index.search(
                        collection, values, company=company, seat=s, model=model, now=now, limit=limit, labels=labels
                    )
                    for s in seats
                ),
                return_exceptions=True,
            )
            failed = next((a for a in answers if isinstance(a, BaseException)), None)
            if failed is not None and not isinstance(failed, IndexUnavailable):
                raise failed
    min_score = floor(model) if floor is not None else None
    if failed is not None:
        _log.warning("vector index unreachable, exact scan for %s/%s: %s", company, ",".join(seats), failed)
        hits = list(await reads.exact(values, model, limit))
        source = VectorSource.EXACT_SCAN
    else:
        best: dict[uuid.UUID, float] = {}
        for answer in answers:
            assert not isinstance(answer, BaseException)
            for h in answer:
                best[h.id] = max(best.get(h.id, -2.0), h.score)
        # Stable: one seat's hits keep the index's order among equal scores.
        ranked = sorted(best, key=lambda i: -best[i])[:limit]
        if min_score is not None:
            ranked = [i for i in ranked if best[i] >= min_score]
        rows = await reads.hydrate(ranked) if ranked else {}
        waiting = await unindexed(vector) if unindexed is not None else 0
        if waiting:
            _log.debug("%d rows of %s/%s not in the index yet, exact scan", waiting, company, ",".join(seats))
            hits = list(await reads.exact(values, model, limit))
            source = VectorSource.EXACT_SCAN
        else:
            hits = [(rows[i], best[i]) for i in ranked if i in rows]
            source = VectorSource.INDEX
    if min_score is not None:
        hits = [(row, sim) for row, sim in hits if sim >= min_score]
    count = await unreachable(vector) if unreachable is not None else 0
    return VectorHalf(query.status, source, hits, count, min_score)
