"""What the use cases of a seat's vector rows (diary notes, raw episodes) are built from, once: the
same dependencies (store, embedder, index, clock, config, events, the relevance floors), wired the
same way from the shared infrastructure, the same steps of the vector path over them (embed a
written row within the budget, index it, embed a query, search one seat's rows), and the same way
of reading a search's rows once the index has answered (:class:`AfterSearchReads`: one statement).
"""

from __future__ import annotations

import logging
import uuid
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

import numpy as np

from libs.common import vector_path
from libs.common.clock import Clock
from libs.common.coalescer import Coalescer
from libs.common.config import RelevanceConfig
from libs.common.embeddings import Embedder, Vector
from libs.common.events import EventSink
from libs.common.vector_path import InlineEmbedding, QueryEmbedding, RowReads, VectorHalf
from libs.common.vectorindex import IndexPoint, IndexUnavailable, VectorIndex, collection_name

if TYPE_CHECKING:
    from libs.common.infra import Infra

__all__ = ["AfterSearchReads", "SearchedRows", "VectorRowService", "VectorRowWriter"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class IndexedStore(Protocol):
    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        """Mark rows whose points the index now holds (the fill pass skips them)."""
        ...


class EmbedBudget(Protocol):
    @property
    def embed_budget_seconds(self) -> float:
        """How long a request waits for an embedding before it goes on without one."""
        ...


class SearchedRows(Protocol[T_co]):
    """What a search reads of its table once the index has answered, in one statement."""

    @property
    def hits(self) -> Mapping[uuid.UUID, T_co]:
        """The index hits' rows still live and in scope (a stale point's id is simply absent)."""
        ...

    @property
    def unreachable(self) -> int:
        """Live rows of the scope with no vector of the query's model and width."""
        ...

    @property
    def unindexed(self) -> int:
        """Live rows of the scope with a vector of the query's model and width that the index does
        not hold yet (``indexed = false``: written while it was down, or embedded by the fill since
        the last index pass)."""
        ...


S = TypeVar("S", bound=IndexedStore)
C = TypeVar("C", bound=EmbedBudget)
R = TypeVar("R", bound=SearchedRows[Any])
W = TypeVar("W", bound=IndexedStore, covariant=True)
"""A writer's store, covariant: a writer over a store's deployment type serves as one over its port."""


class VectorRowWriter(Generic[W]):
    """What writes a row with its vector (a note, an episode, a knowledge page): its store,
    embedder, index and clock, as arguments (no patching), and the two steps of the write: embed the
    row's text within the budget, index the stored row's point."""

    collection_base: ClassVar[str]
    """The family of the rows' index collections (``collection_name(base, dims)``)."""

    def __init__(
        self, store: W, embedder: Embedder | None, index: VectorIndex, clock: Clock, embed_budget_seconds: float
    ):
        self.store = store
        self.embedder = embedder
        self.index = index
        self.clock = clock
        self.embed_budget_seconds = embed_budget_seconds
        """How long a write (or a query) waits for its embedding before it goes on without one."""
        self._index_batcher: Coalescer[tuple[IndexPoint, str], bool] = Coalescer(self._index_batch, max_batch=256)

    async def embed_row(self, text: str) -> InlineEmbedding:
        """A written row's vector within the budget (none, with the reason, past it)."""
        return await vector_path.embed_inline(self.embedder, text, self.embed_budget_seconds)

    async def index_row(self, point: IndexPoint, what: str) -> bool:
        """Index a stored row's point now and mark it indexed (the fill pass retries a failure)."""
        return await vector_path.index_row(self.index, self.collection_base, point, self.store.set_indexed, what)

    async def index_rows_together(self, point: IndexPoint, what: str) -> bool:
        """:meth:`index_row`, with the points of concurrent writes upserted together (one index
        call per width) and marked indexed in one statement: same outcome for each row — True once
        its point is in the index and the row is marked; False (the row keeps ``indexed = false``,
        the index pass puts it in later) when the index cannot be reached; the store's error when
        the mark fails."""
        return await self._index_batcher.submit((point, what))

    async def _index_batch(self, items: list[tuple[IndexPoint, str]]) -> list[bool | Exception]:
        by_dims: dict[int, list[int]] = defaultdict(list)
        for k, (point, _) in enumerate(items):
            by_dims[int(point.vector.shape[0])].append(k)
        done = [False] * len(items)
        for dims, ks in by_dims.items():
            try:
                await self.index.upsert(collection_name(self.collection_base, dims), [items[k][0] for k in ks])
            except IndexUnavailable as err:
                for k in ks:
                    _log.warning("%s %s stored but not indexed: %s", items[k][1], items[k][0].id, err)
                continue
            for k in ks:
                done[k] = True
        marked = [items[k][0].id for k in range(len(items)) if done[k]]
        if marked:
            try:
                await self.store.set_indexed(marked)
            except Exception as exc:  # every marked row's caller learns it, as with one row alone
                return [exc if d else False for d in done]
        return list(done)


class VectorRowService(VectorRowWriter[S], Generic[S, C]):
    """The dependencies of a seat's vector-row service (a writer with its config, events and
    relevance floors), as arguments (no patching)."""

    def __init__(
        self,
        store: S,
        embedder: Embedder | None,
        index: VectorIndex,
        clock: Clock,
        config: C,
        events: EventSink,
        relevance: RelevanceConfig | None = None,
    ):
        super().__init__(store, embedder, index, clock, config.embed_budget_seconds)
        self.relevance = relevance or RelevanceConfig()
        """The floor per embedding model below which a vector hit is not related (``learning.relevance``)."""
        self.config = config
        self.events = events

    @classmethod
    def wired(cls, infra: Infra, store: S, config: C) -> Self:
        """The service over ``store`` with its ``config``; the rest from the shared infrastructure."""
        return cls(
            store=store,
            embedder=infra.embedder,
            index=infra.index,
            clock=infra.clock,
            config=config,
            events=infra.events,
            relevance=infra.settings.learning.relevance,
        )

    async def embed_query(self, query: str, provided: Vector | None) -> QueryEmbedding:
        """The caller's query vector when it sent one, else ``query`` embedded within the budget."""
        if provided is not None:
            return QueryEmbedding.provided(provided)
        return await vector_path.embed_query(self.embedder, query, self.embed_budget_seconds)

    async def seat_half(
        self,
        embedded: QueryEmbedding,
        reads: RowReads[T],
        *,
        company: str,
        seat: str,
        now: float,
        limit: int,
        unreachable: Callable[[Vector], Awaitable[int]],
        unindexed: Callable[[Vector], Awaitable[int]],
        labels: Mapping[str, str] | None = None,
    ) -> VectorHalf[T]:
        """The vector half over one seat's rows, held to the query model's relevance floor; the
        exact scan when the index cannot answer or does not hold every row yet (``unindexed``)."""
        return await vector_path.vector_half(
            embedded,
            self.index,
            self.collection_base,
            reads,
            company=company,
            seats=(seat,),
            now=now,
            limit=limit,
            labels=labels,
            floor=self.relevance.floor,
            unreachable=unreachable,
            unindexed=unindexed,
        )


class AfterSearchReads(ABC, Generic[T, R]):
    """One request's :class:`~libs.common.vector_path.RowReads` whose re-read of the index hits is
    one statement that also counts the rows the query's model cannot reach and the rows the index
    does not hold yet (and reads whatever else the search needs then: the episodes' lexical half),
    so the vector half costs one round trip after the index search (two, with the exact scan, while
    rows wait for the index pass). When no hit is re-read (none ranked, or the exact scan answered),
    the counts ask the same statement with no ids. ``after`` holds its answer for the rest of the
    request."""

    after: R | None = None

    @abstractmethod
    async def exact(self, vector: np.ndarray, model: str, limit: int) -> Sequence[tuple[T, float]]:
        """The exact scan (:meth:`~libs.common.vector_path.RowReads.exact`)."""

    @abstractmethod
    async def read_after_search(self, ids: Sequence[uuid.UUID]) -> R:
        """The one statement: the rows of ``ids``, the unreachable and unindexed counts, and the rest."""

    async def hydrate(self, ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, T]:
        self.after = await self.read_after_search(ids)
        return self.after.hits

    async def unreachable(self, vector: Vector) -> int:
        return (await self._after()).unreachable

    async def unindexed(self, vector: Vector) -> int:
        return (await self._after()).unindexed

    async def _after(self) -> R:
        if self.after is None:
            self.after = await self.read_after_search(())
        return self.after
