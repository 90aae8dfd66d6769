"""The native backend: pages in PostgreSQL, searched by words and by meaning.

- ``search``: best effort, never raises. Two halves run concurrently — the IDF-weighted lexical
  match and the vector half (the index, or an exact pgvector scan when the index cannot answer) —
  fused by reciprocal rank. Scoped to the access's containers; the Auto-Drafted Skills subtree and
  ``[Auto-draft]`` titles are excluded inside every search query of the store.
- ``get_page`` / ``list_pages``: reads by id and by listing (the service checks visibility).
- ``onboarding``: the pages under an ``Onboarding`` page (or titled ``Onboarding…``) of the named
  containers, own unit first.
- The ``PromotionWriter`` half: a draft is filed in the unit's container under its
  ``Auto-Drafted Skills`` page (created when missing), deduplicated by title (a page of that title
  already there, draft or published, answers ``created`` False and is left alone). The title is
  not given the ``[Auto-draft]`` prefix: this backend has a parent chain, and a prefix would keep a
  page a lead published out of every search.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from libs.common.config import Settings
from libs.common.embeddings import Embedder, Vector
from libs.common.vector_path import EmbeddingStatus, QueryEmbedding, embed_query, vector_half
from libs.common.vectorindex import VectorIndex
from services.knowledge.backends import BackendUnavailable
from services.knowledge.domain import (
    AUTO_DRAFTED_PARENT,
    COLLECTION_BASE,
    Access,
    KnowledgeHit,
    Limits,
    Page,
    PageListing,
    PageQuery,
    PromotionDraft,
    PromotionResult,
    SearchOutcome,
    ServedMode,
    UnsearchedReason,
    is_native_id,
)
from services.knowledge.native import NativePages
from services.knowledge.ports import PageStore, VectorHits
from services.knowledge.store import StoreUnavailable, one_line

__all__ = ["MIN_SIMILARITY", "PARENT_BODY", "RRF_K", "NativeBackend"]

_log = logging.getLogger(__name__)

RRF_K = 60
"""Reciprocal-rank fusion constant: a page's score is the sum over the halves that found it of
1 / (RRF_K + its rank there), so a page both halves found outranks one only either found."""
MIN_SIMILARITY = 0.25
"""A vector hit below this cosine similarity is dropped: the vector half always returns its top K,
however unrelated, and an unrelated page in the prompt is noise. Chosen on the local MiniLM, where
unrelated page/query pairs score about -0.1 to 0.2 and a paraphrase sharing no word 0.3 to 0.4."""

PARENT_BODY = (
    "Drafts distilled from procedures several agents of this unit converged on. They are hidden from "
    "every agent's knowledge search until a lead reviews one and moves it out of this page; delete a "
    "draft to reject it."
)


@dataclass
class _Found:
    page: Page
    snippet: str
    score: float = 0.0
    similarity: float = 0.0
    lexical_rank: float = 0.0
    halves: set[str] = field(default_factory=set)


@dataclass
class _ContainerReads:
    """The vector half's reads of the searchable pages of the access's containers for one query
    vector. The re-read of the index hits also counts the pages the index does not hold yet (one
    statement); ``after`` keeps that answer for the count asked next."""

    store: PageStore
    company: str
    containers: list[str]
    query: str
    vector: Vector
    after: VectorHits | None = None

    async def exact(self, vector: np.ndarray, model: str, limit: int) -> Sequence[tuple[tuple[Page, str], float]]:
        found = await self.store.exact(self.company, self.containers, self.query, vector, model, limit)
        return [((page, snippet), sim) for page, sim, snippet in found]

    async def hydrate(self, ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, tuple[Page, str]]:
        v = self.vector
        self.after = await self.store.hydrate(self.company, self.containers, self.query, ids, v.model, v.dimensions)
        return self.after.pages

    async def unindexed(self, vector: Vector) -> int:
        """Searchable pages of the scope whose vector the index does not hold yet (asked after the
        re-read; when the index ranked nothing, the same statement with no ids)."""
        if self.after is None:
            await self.hydrate(())
        assert self.after is not None
        return self.after.unindexed


def _unavailable(err: BaseException) -> BackendUnavailable:
    return BackendUnavailable(UnsearchedReason.UNREACHABLE, f"native pages: {err}")


class NativeBackend:
    """Pages in PostgreSQL: the IDF-weighted lexical half ∪ the vector half, fused by reciprocal rank."""

    mode: ServedMode | None = ServedMode.NATIVE

    def __init__(
        self,
        pages: NativePages[PageStore],
        settings: Settings,
        embedder: Embedder | None,
        index: VectorIndex | None,
        *,
        limits: Limits | None = None,
        min_similarity: float = MIN_SIMILARITY,
    ):
        self.pages = pages
        self.store: PageStore = pages.store
        self.settings = settings
        self.embedder = embedder
        self.index = index
        self.limits = limits or Limits()
        self.min_similarity = min_similarity

    # ------------------------------------------------------------------ search

    def can_search(self, access: Access) -> bool:
        return bool(access.containers) or access.operator

    async def search(self, access: Access, query: str, limit: int, *, vector: Vector | None = None) -> SearchOutcome:
        company, containers = access.reader.company, list(access.containers)
        if not containers:
            return SearchOutcome.did_not_run(UnsearchedReason.SCOPED_TO_NOTHING)
        if not query.strip():
            return SearchOutcome(ServedMode.NATIVE)
        try:
            async with asyncio.TaskGroup() as tg:
                lexical = tg.create_task(self.store.lexical(company, containers, query, limit))
                by_meaning = tg.create_task(self._vector_half(company, containers, query, limit, vector))
        except Exception as err:  # best effort by contract: the search did not run
            cause = err.exceptions[0] if isinstance(err, ExceptionGroup) else err
            if isinstance(cause, StoreUnavailable):
                _log.warning("native knowledge search for %s did not run: %s", company, cause)
            else:
                _log.error("native knowledge search for %s failed", company, exc_info=cause)
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, "the native pages could not be read")
        return SearchOutcome(ServedMode.NATIVE, None, self._fuse(lexical.result(), by_meaning.result(), limit))

    def _fuse(
        self, lexical: list[tuple[Page, float, str]], vector: list[tuple[Page, float, str]], limit: int
    ) -> tuple[KnowledgeHit, ...]:
        found: dict[str, _Found] = {}
        for rank, (page, score, snippet) in enumerate(lexical, 1):
            f = found.setdefault(page.id, _Found(page, snippet))
            f.score += 1.0 / (RRF_K + rank)
            f.lexical_rank = score
            f.halves.add("lexical")
        for rank, (page, similarity, snippet) in enumerate(vector, 1):
            f = found.setdefault(page.id, _Found(page, snippet))
            f.score += 1.0 / (RRF_K + rank)
            f.similarity = similarity
            f.halves.add("vector")
        ordered = sorted(
            found.values(), key=lambda f: (-f.score, -f.lexical_rank, -f.similarity, f.page.title, f.page.id)
        )
        return tuple(
            KnowledgeHit(
                page_id=f.page.id,
                title=f.page.title,
                container=f.page.container,
                snippet=f.snippet,
                body=f.page.body,
            )
            for f in ordered[:limit]
        )

    def _usable(self, vector: Vector | None) -> Vector | None:
        """The caller's vector when this backend's pages are of its model and width, else None."""
        if vector is None or self.embedder is None or vector.model != self.embedder.model:
            return None
        dims = self.embedder.dimensions
        return vector if dims is None or dims == vector.dimensions else None

    async def _vector_half(
        self, company: str, containers: list[str], query: str, limit: int, vector: Vector | None = None
    ) -> list[tuple[Page, float, str]]:
        # The caller's vector (the turn's ask, embedded once a turn) spares a second model run;
        # one of another model or width is not comparable with the pages' and the query is embedded.
        given = self._usable(vector)
        if given is not None:
            embedded = QueryEmbedding.provided(given)
        else:
            budget = self.settings.learning.prefetch.embed_budget_seconds
            embedded = await embed_query(self.embedder, query, budget)
        if embedded.vector is None:
            if embedded.status is EmbeddingStatus.FAILED:
                _log.warning("knowledge query not embedded, lexical half only: %s", embedded.reason)
            return []
        # Oversampled: the store drops auto-drafts and stale points after the index answered. The
        # container rides in the points' seat field: one search per container of the scope.
        reads = _ContainerReads(self.store, company, containers, query, embedded.vector)
        half = await vector_half(
            embedded,
            self.index,
            COLLECTION_BASE,
            reads,
            company=company,
            seats=containers,
            now=0.0,
            limit=max(limit * 3, 10),
            floor=lambda _model: self.min_similarity,
            unindexed=reads.unindexed,
        )
        return [(page, sim, snippet) for (page, snippet), sim in half.hits]

    # ------------------------------------------------------------------ reads

    async def get_page(self, access: Access, page_id: str) -> Page | None:
        if not is_native_id(page_id):
            return None
        try:
            return await self.store.get(access.reader.company, uuid.UUID(page_id))
        except StoreUnavailable as err:
            raise _unavailable(err) from err

    async def list_pages(self, access: Access, query: PageQuery) -> PageListing:
        after = None
        cursor, size = query.cursor, query.size
        if cursor is not None:
            after = (str(cursor["c"]), str(cursor["t"]), uuid.UUID(str(cursor["id"])))
        try:
            pages = await self.store.list(access.reader.company, query, after, size + 1)
        except StoreUnavailable as err:
            raise _unavailable(err) from err
        more = len(pages) > size
        pages = pages[:size]
        last = pages[-1] if pages else None
        nxt: dict[str, object] | None = None
        if more and last is not None:
            nxt = {"c": last.container, "t": last.title, "id": last.id}
        return PageListing(tuple(pages), nxt)

    async def onboarding(self, access: Access, containers: Sequence[str], limit: int) -> SearchOutcome:
        if not containers:
            return SearchOutcome(ServedMode.NATIVE)
        try:
            pages = await self.store.onboarding(access.reader.company, list(containers), limit)
        except StoreUnavailable as err:
            _log.warning("onboarding pages of %s unreadable: %s", access.reader.company, err)
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, "the native pages could not be read")
        return SearchOutcome(
            ServedMode.NATIVE,
            None,
            tuple(
                KnowledgeHit(page_id=p.id, title=p.title, container=p.container, snippet=one_line(p.body, 200))
                for p in pages
            ),
        )

    # ------------------------------------------------------------------ PromotionWriter

    async def existing_draft(self, company: str, container: str, title: str) -> PromotionResult | None:
        found = await self.store.by_title(company, container, title)
        if found is None:
            return None
        return PromotionResult(page_id=found.id, page_title=found.title, created=False, backend=ServedMode.NATIVE)

    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        existing = await self.existing_draft(draft.company, draft.container_key, draft.title)
        if existing is not None:
            return existing
        # The draft first, its parent after: a draft refused (a body too large for the full-text
        # index) leaves no parent behind, and a draft names its parent by title, hidden either way.
        page, created, _ = await self.pages.upsert_page(
            draft.company, draft.container_key, draft.title, draft.body, [AUTO_DRAFTED_PARENT]
        )
        if await self.store.by_title(draft.company, draft.container_key, AUTO_DRAFTED_PARENT) is None:
            await self.pages.upsert_page(draft.company, draft.container_key, AUTO_DRAFTED_PARENT, PARENT_BODY, [])
        return PromotionResult(page_id=page.id, page_title=page.title, created=created, backend=ServedMode.NATIVE)
