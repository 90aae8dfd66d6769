"""The native pages' store port: what :class:`services.knowledge.native.NativePages` (the write)
and :class:`services.knowledge.native_search.NativeBackend` (search, reads, promotion drafts) need.

``PostgresPageStore`` (``store.py``) is the deployment's; ``tests/unit/fakes/knowledge.py`` keeps
pages in memory for the unit tier. Search reads raise ``StoreUnavailable`` when the pages cannot be
read.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol

import numpy as np

from services.knowledge.domain import Page, PageQuery

__all__ = ["PageStore", "PageWrite", "VectorHits"]


class VectorHits(NamedTuple):
    """The vector half's read after the index search: the hits' searchable pages with their
    snippets, and how many searchable pages of the scope have a vector of the query's model and
    width the index does not hold yet (``indexed = false``: written while it was down; while there
    are any, the exact scan answers, since the index's answer would miss them)."""

    pages: dict[uuid.UUID, tuple[Page, str]]
    unindexed: int


@dataclass(frozen=True)
class PageWrite:
    """One page as UpsertPage writes it: the one argument the port, the Postgres store and the unit
    tier's fake take, rather than each restating nine parameters."""

    page_id: uuid.UUID
    """The id a page created by this write gets (a replaced page keeps its own)."""
    company: str
    container: str
    title: str
    body: str
    parent_titles: tuple[str, ...]
    now: datetime
    vector: np.ndarray | None
    """None: stored without a vector (the fill embeds it)."""
    model: str | None
    """The vector's model (ignored without a vector)."""


class PageStore(Protocol):
    async def by_title(self, company: str, container: str, title: str) -> Page | None: ...

    async def stored_vector(self, page_id: uuid.UUID) -> np.ndarray | None:
        """The page's own vector, when it has one (a move between parents re-embeds nothing)."""
        ...

    async def upsert(self, write: PageWrite) -> tuple[Page, bool]:
        """Create or replace the page of (container, title); whether this call created it."""
        ...

    async def get(self, company: str, page_id: uuid.UUID) -> Page | None: ...

    async def list(
        self, company: str, query: PageQuery, after: tuple[str, str, uuid.UUID] | None, limit: int
    ) -> builtins.list[Page]:
        """``query``'s pages (its ``containers`` None: all) in (container, title, id) order after
        ``after``, at most ``limit`` (its ``cursor`` and ``size`` are the backend's, already read)."""
        ...

    async def lexical(
        self, company: str, containers: Sequence[str], query: str, limit: int
    ) -> builtins.list[tuple[Page, float, str]]:
        """Searchable pages sharing words with ``query``: (page, rank, snippet), best first."""
        ...

    async def hydrate(
        self, company: str, containers: Sequence[str], query: str, ids: Sequence[uuid.UUID], model: str, dims: int
    ) -> VectorHits:
        """The searchable pages of these ids with a vector of ``model``, and their snippets; and, in
        the same read, the count of searchable pages with a vector of ``model`` and ``dims`` not in
        the index yet."""
        ...

    async def exact(
        self, company: str, containers: Sequence[str], query: str, vector: np.ndarray, model: str, limit: int
    ) -> builtins.list[tuple[Page, float, str]]:
        """The exact scan: searchable pages with a vector of ``model`` by cosine, best first."""
        ...

    async def onboarding(self, company: str, containers: Sequence[str], limit: int) -> builtins.list[Page]: ...

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None: ...
