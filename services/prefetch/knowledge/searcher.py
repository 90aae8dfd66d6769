"""The knowledge-search seam (``Searcher``) and its native backend (pages in PostgreSQL).

A searcher answers three questions for the prefetch and the ``search_knowledge`` builtin:

- ``can_search(company, role)``: with no I/O, could a search return anything? True when the role
  has accessible containers (``RoleConfig.knowledge_containers`` of the company's role). An
  unknown role, or one with no containers, cannot: the caller skips the query generation.
- ``search(company, role, query, limit)``: best effort, never raises. Scoped to the role's
  containers; the Auto-Drafted Skills subtree and ``[Auto-draft]`` titles excluded in the store.
  The outcome says whether the search ran (see :class:`SearchOutcome`).
- ``onboarding_pages(company, unit_chain)``: the Onboarding pages of the containers the unit
  chain names. A unit's container is the unit's name (its wiki space key): unit ``platform``
  reads container ``platform``. Best effort: an unreadable store yields no pages.

``build_searcher`` always wires the native backend (it is always configured). ``"unconfigured"``
is reserved for :class:`UnconfiguredSearcher`, a searcher built with no backend at all, e.g. by a
deployment that turns knowledge off or a test; a Confluence backend would be a third class.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from libs.common.config import Settings, workspace_container
from libs.common.embeddings import Embedder, EmbeddingError
from libs.common.vectorindex import IndexHit, IndexUnavailable, VectorIndex, collection_name
from services.prefetch.knowledge.domain import COLLECTION_BASE, KnowledgeHit, Limits, Page, SearchOutcome
from services.prefetch.knowledge.store import PostgresPageStore, StoreUnavailable, one_line

__all__ = [
    "NativeSearcher",
    "Searcher",
    "UnconfiguredSearcher",
    "build_searcher",
    "role_containers",
]

_log = logging.getLogger(__name__)

RRF_K = 60
"""Reciprocal-rank fusion constant: a page's score is the sum over the halves that found it of
1 / (RRF_K + its rank there), so a page both halves found outranks one only either found."""
MIN_SIMILARITY = 0.25
"""A vector hit below this cosine similarity is dropped: the vector half always returns its top K,
however unrelated, and an unrelated page in the prompt is noise. Chosen on the local MiniLM, where
unrelated page/query pairs score about -0.1 to 0.2 and a paraphrase sharing no word 0.3 to 0.4."""
SEARCH_TIMEOUT_SECONDS = 10.0
"""One search's deadline (embed, index, store): past it the search did not run (unreachable)."""


@runtime_checkable
class Searcher(Protocol):
    def can_search(self, company: str, role: str) -> bool:
        """No I/O: whether a search by this role could return anything."""
        ...

    async def search(self, company: str, role: str, query: str, limit: int) -> SearchOutcome:
        """Best effort: never raises; ``unreachable`` when the store could not be read."""
        ...

    async def onboarding_pages(self, company: str, unit_chain: list[str]) -> list[KnowledgeHit]:
        """The Onboarding pages in the containers of ``unit_chain`` (own unit first)."""
        ...


def _clean(names: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for name in names or ():
        name = (name or "").strip()
        if name and name not in out:
            out.append(name)
    return out


def role_containers(settings: Settings, company: str, role: str) -> list[str]:
    """The containers ``role`` may read in ``company`` (company-specific roles, else the defaults):
    its ``knowledge_containers``, and ``workspace:<name>`` for each of its ``workspaces`` (where the
    session learning checks file a workspace's project lessons). An unknown role reads nothing,
    whatever ``accept_unknown_roles`` says: scope is never implied."""
    cfg = settings.company(company).roles.get(role)
    if cfg is None:
        return []
    return _clean([*cfg.knowledge_containers, *(workspace_container(w) for w in _clean(cfg.workspaces))])


class UnconfiguredSearcher:
    """No knowledge backend: nothing can be searched and every search says so."""

    def can_search(self, company: str, role: str) -> bool:
        return False

    async def search(self, company: str, role: str, query: str, limit: int) -> SearchOutcome:
        return SearchOutcome("unconfigured")

    async def onboarding_pages(self, company: str, unit_chain: list[str]) -> list[KnowledgeHit]:
        return []


@dataclass
class _Found:
    page: Page
    snippet: str
    score: float = 0.0
    similarity: float = 0.0
    lexical_rank: float = 0.0
    halves: set[str] = field(default_factory=set)


class NativeSearcher:
    """Pages in PostgreSQL: the IDF-weighted lexical half ∪ the vector half (the index, or an exact
    scan when the index cannot answer), fused by reciprocal rank."""

    def __init__(
        self,
        store: PostgresPageStore,
        settings: Settings,
        embedder: Embedder | None,
        index: VectorIndex | None,
        *,
        limits: Limits | None = None,
        min_similarity: float = MIN_SIMILARITY,
        timeout_seconds: float = SEARCH_TIMEOUT_SECONDS,
    ):
        self.store = store
        self.settings = settings
        self.embedder = embedder
        self.index = index
        self.limits = limits or Limits()
        self.min_similarity = min_similarity
        self.timeout_seconds = timeout_seconds

    def can_search(self, company: str, role: str) -> bool:
        return bool(role_containers(self.settings, company, role))

    def _limit(self, limit: int) -> int:
        if limit <= 0:
            limit = self.settings.learning.prefetch.knowledge_results
        return max(1, min(limit, self.limits.search_results))

    async def search(self, company: str, role: str, query: str, limit: int) -> SearchOutcome:
        containers = role_containers(self.settings, company, role)
        if not containers:
            return SearchOutcome("scoped_to_nothing")
        limit = self._limit(limit)
        if not query.strip():
            return SearchOutcome("searched")
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with asyncio.TaskGroup() as tg:
                    lexical = tg.create_task(self.store.lexical(company, containers, query, limit))
                    vector = tg.create_task(self._vector_half(company, containers, query, limit))
        except Exception as err:  # best effort by contract: the search did not run
            cause = err.exceptions[0] if isinstance(err, ExceptionGroup) else err
            if isinstance(cause, (StoreUnavailable, TimeoutError)):
                _log.warning("knowledge search for %s/%s did not run: %s", company, role, cause)
            else:
                _log.error("knowledge search for %s/%s failed", company, role, exc_info=cause)
            return SearchOutcome("unreachable")
        return SearchOutcome("searched", self._fuse(lexical.result(), vector.result(), limit))

    def _fuse(
        self, lexical: list[tuple[Page, float, str]], vector: list[tuple[Page, float, str]], limit: int
    ) -> list[KnowledgeHit]:
        found: dict[uuid.UUID, _Found] = {}
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
            found.values(), key=lambda f: (-f.score, -f.lexical_rank, -f.similarity, f.page.title, str(f.page.id))
        )
        return [
            KnowledgeHit(
                page_id=str(f.page.id),
                title=f.page.title,
                container=f.page.container,
                snippet=f.snippet,
                body=f.page.body,
            )
            for f in ordered[:limit]
        ]

    async def _embed(self, query: str) -> tuple[np.ndarray, str] | None:
        if self.embedder is None:
            return None
        try:
            async with asyncio.timeout(self.settings.learning.prefetch.embed_budget_seconds):
                [vec] = await self.embedder.embed([query])
        except (TimeoutError, EmbeddingError) as err:
            _log.warning("knowledge query not embedded, lexical half only: %s", err or type(err).__name__)
            return None
        return None if vec is None else (vec.values, vec.model)

    async def _vector_half(
        self, company: str, containers: list[str], query: str, limit: int
    ) -> list[tuple[Page, float, str]]:
        embedded = await self._embed(query)
        if embedded is None:
            return []
        values, model = embedded
        # Oversampled: the store drops auto-drafts and stale points after the index answered.
        k = max(limit * 3, 10)
        if self.index is None:
            failed: BaseException | None = IndexUnavailable("no vector index wired")
            answers: list = []
        else:
            collection = collection_name(COLLECTION_BASE, int(values.shape[0]))
            answers = await asyncio.gather(
                *(
                    self.index.search(collection, values, company=company, seat=c, model=model, now=0.0, limit=k)
                    for c in containers
                ),
                return_exceptions=True,
            )
            failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            if not isinstance(failed, IndexUnavailable):
                raise failed
            _log.warning("vector index unreachable, exact scan for %s: %s", company, failed)
            exact = await self.store.exact(company, containers, query, values, model, k)
            return [(p, s, snip) for p, s, snip in exact if s >= self.min_similarity]
        hits: list[IndexHit] = [h for a in answers for h in a]
        best: dict[uuid.UUID, float] = {}
        for h in hits:
            best[h.id] = max(best.get(h.id, -1.0), h.score)
        ranked = sorted((i for i in best if best[i] >= self.min_similarity), key=lambda i: -best[i])[:k]
        if not ranked:
            return []
        pages = await self.store.hydrate(company, containers, query, ranked, model)
        return [(pages[i][0], best[i], pages[i][1]) for i in ranked if i in pages]

    async def onboarding_pages(self, company: str, unit_chain: list[str]) -> list[KnowledgeHit]:
        containers = _clean(unit_chain)
        if not containers:
            return []
        try:
            async with asyncio.timeout(self.timeout_seconds):
                pages = await self.store.onboarding(company, containers, self.limits.onboarding_results)
        except (StoreUnavailable, TimeoutError) as err:
            _log.warning("onboarding pages of %s unreadable: %s", company, err)
            return []
        return [
            KnowledgeHit(
                page_id=str(p.id), title=p.title, container=p.container, snippet=one_line(p.body, 200), body=p.body
            )
            for p in pages
        ]


def build_searcher(infra) -> Searcher:  # type: ignore[no-untyped-def]
    """The deployment's searcher: the native backend over the shared pool, embedder and index."""
    return NativeSearcher(PostgresPageStore(infra.pool), infra.settings, infra.embedder, infra.index)
