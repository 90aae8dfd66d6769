"""The native pages' store port (``services.knowledge.ports.PageStore``) in memory, for the unit tier.

Search reads are scoped to one company and a list of containers and leave out the Auto-Drafted
Skills subtree and ``[Auto-draft]`` titles (``Page.draft``), whichever half asks, as the Postgres
store's ``_VISIBLE`` does; a vector hit is re-read only while the page holds a vector of the query's
model. ``calls`` records which reads ran; ``down`` makes every search read raise ``StoreUnavailable``.
"""

from __future__ import annotations

import builtins
import dataclasses
import uuid
from collections.abc import Sequence

import numpy as np

from services.knowledge.domain import ONBOARDING_PARENT, Page, PageQuery, ServedMode
from services.knowledge.ports import PageWrite, VectorHits
from services.knowledge.store import StoreUnavailable, one_line
from tests.unit.fakes.lexical import cosine, idf_ranked

__all__ = ["MemoryPageStore"]


@dataclasses.dataclass
class _Row:
    page: Page
    vector: np.ndarray | None
    indexed: bool = False


class MemoryPageStore:
    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, _Row] = {}
        self.calls: list[str] = []
        self.down = False

    def _read(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise StoreUnavailable("the fake store is down")

    def _scope(self, company: str, containers: Sequence[str]) -> list[_Row]:
        return [
            r
            for r in self.rows.values()
            if r.page.company == company and r.page.container in containers and not r.page.draft
        ]

    def delete(self, page_id: uuid.UUID) -> None:
        """A page gone (an erasure) with its point left behind."""
        del self.rows[page_id]

    def indexed(self, page_id: uuid.UUID) -> bool:
        return self.rows[page_id].indexed

    async def by_title(self, company: str, container: str, title: str) -> Page | None:
        return next(
            (
                r.page
                for r in self.rows.values()
                if (r.page.company, r.page.container, r.page.title) == (company, container, title)
            ),
            None,
        )

    async def stored_vector(self, page_id: uuid.UUID) -> np.ndarray | None:
        row = self.rows.get(page_id)
        return None if row is None else row.vector

    async def upsert(self, write: PageWrite) -> tuple[Page, bool]:
        vector = write.vector
        earlier = await self.by_title(write.company, write.container, write.title)
        created = earlier is None
        pid = write.page_id if earlier is None else earlier.uuid
        page = Page(
            id=str(pid),
            company=write.company,
            container=write.container,
            title=write.title,
            body=write.body,
            parent_titles=tuple(write.parent_titles),
            update_time=write.now,
            backend=ServedMode.NATIVE,
            create_time=write.now if earlier is None else earlier.create_time,
            embedding_model=write.model if vector is not None else None,
            embedding_dims=int(vector.shape[0]) if vector is not None else None,
        )
        self.rows[pid] = _Row(page, None if vector is None else vector.astype(np.float32))
        return page, created

    async def get(self, company: str, page_id: uuid.UUID) -> Page | None:
        self._read("get")
        row = self.rows.get(page_id)
        return row.page if row is not None and row.page.company == company else None

    async def list(
        self, company: str, query: PageQuery, after: tuple[str, str, uuid.UUID] | None, limit: int
    ) -> builtins.list[Page]:
        self._read("list")
        containers, parent_title = query.containers, query.parent_title
        pages = [
            r.page
            for r in self.rows.values()
            if r.page.company == company
            and (containers is None or r.page.container in containers)
            and (parent_title is None or (r.page.parent_titles and r.page.parent_titles[-1] == parent_title))
            and (query.include_drafts or not r.page.draft)
        ]
        pages.sort(key=lambda p: (p.container, p.title, p.uuid))
        if after is not None:
            pages = [p for p in pages if (p.container, p.title, p.uuid) > after]
        return [p if query.with_body else dataclasses.replace(p, body="") for p in pages[:limit]]

    async def lexical(
        self, company: str, containers: Sequence[str], query: str, limit: int
    ) -> builtins.list[tuple[Page, float, str]]:
        self._read("lexical")
        ranked = idf_ranked(self._scope(company, containers), lambda r: f"{r.page.title} {r.page.body}", query)
        ranked.sort(key=lambda p: (-p[1], p[0].page.id))
        return [(r.page, rank, one_line(r.page.body)) for r, rank in ranked[:limit]]

    async def hydrate(
        self, company: str, containers: Sequence[str], query: str, ids: Sequence[uuid.UUID], model: str, dims: int
    ) -> VectorHits:
        self._read("hydrate")
        wanted = set(ids)
        scope = self._scope(company, containers)
        return VectorHits(
            {
                r.page.uuid: (r.page, one_line(r.page.body))
                for r in scope
                if r.page.uuid in wanted and r.vector is not None and r.page.embedding_model == model
            },
            sum(
                1
                for r in scope
                if r.vector is not None
                and r.page.embedding_model == model
                and r.vector.shape[0] == dims
                and not r.indexed
            ),
        )

    async def exact(
        self, company: str, containers: Sequence[str], query: str, vector: np.ndarray, model: str, limit: int
    ) -> builtins.list[tuple[Page, float, str]]:
        self._read("exact")
        scored = [
            (r.page, cosine(r.vector, vector), one_line(r.page.body))
            for r in self._scope(company, containers)
            if r.vector is not None and r.page.embedding_model == model and r.vector.shape == vector.shape
        ]
        scored.sort(key=lambda p: -p[1])
        return scored[:limit]

    async def onboarding(self, company: str, containers: Sequence[str], limit: int) -> builtins.list[Page]:
        self._read("onboarding")
        pages = [
            r.page
            for r in self._scope(company, containers)
            if ONBOARDING_PARENT in r.page.parent_titles or r.page.title.startswith(ONBOARDING_PARENT)
        ]
        pages.sort(key=lambda p: (list(containers).index(p.container), len(p.parent_titles), p.title, p.id))
        return pages[:limit]

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        for i in ids:
            if i in self.rows:
                self.rows[i].indexed = True
