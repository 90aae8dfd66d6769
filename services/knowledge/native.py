"""Native pages: the write (with the inline embed), whatever the org's search backend is.

UpsertPage always writes here: operators' and tests' pages, session learning's project lessons
(``workspace:<name>``), the Tool Skills registry on a native deployment, and native promotion
drafts. Dependencies arrive as arguments (store, embedder, index, clock, limits). Reading and
searching are :class:`services.knowledge.native_search.NativeBackend`'s.
"""

from __future__ import annotations

import logging
import re
import uuid

import numpy as np
from typing_extensions import TypeVar

from libs.common.bounds import at_most_items
from libs.common.clock import Clock
from libs.common.embeddings import Embedder
from libs.common.errors import InvalidArgument
from libs.common.validation import require_ident, require_text
from libs.common.vector_service import VectorRowWriter
from libs.common.vectorindex import IndexPoint, VectorIndex
from services.knowledge.domain import COLLECTION_BASE, DOMAIN, Limits, Page, embedding_text
from services.knowledge.ports import PageStore, PageWrite
from services.knowledge.store import PostgresPageStore

__all__ = ["EMBED_BUDGET_SECONDS", "NativePages", "check_title", "index_point"]

_log = logging.getLogger(__name__)

EMBED_BUDGET_SECONDS = 2.0
"""A page's inline embed has the diary's two-second budget; past it the page is stored without a
vector (never refused) and the fill embeds it."""

S = TypeVar("S", bound=PageStore, default=PostgresPageStore, covariant=True)
"""The store: the port for the write and the search; its deployment type for the passes and the
erasure, which reach its pool."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TOO_MANY_PARENTS = "a page has at most {limit} ancestors, got {count}"


def index_point(page_id: uuid.UUID, company: str, container: str, vector: np.ndarray, model: str) -> IndexPoint:
    """A page's point: the container rides in the ``seat`` field, so a search is filtered by the
    company and one container of the role's scope at a time (both tenant-indexed keywords)."""
    return IndexPoint(id=page_id, vector=vector, company=company, seat=container, model=model)


def check_title(value: str, field: str, limits: Limits) -> str:
    """A title (or an ancestor's): required, within the limit, one line without surrounding blanks."""
    require_text(value, field, domain=DOMAIN, max_chars=limits.title_chars)
    if value != value.strip() or _CONTROL.search(value):
        raise InvalidArgument(
            f"{field} must be one line without surrounding whitespace",
            reason="FIELD_INVALID",
            domain=DOMAIN,
            field=field,
            metadata={"value": value[:100]},
        )
    return value


def _requested_id(value: str) -> uuid.UUID:
    """The id a caller asks a new page to get: a UUID (the native pages' ids), else FIELD_INVALID."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(
            f"page_id {value[:100]!r} is not a UUID",
            reason="FIELD_INVALID",
            domain=DOMAIN,
            field="page_id",
            metadata={"value": value[:100]},
        ) from None


class NativePages(VectorRowWriter[S]):
    collection_base = COLLECTION_BASE

    def __init__(
        self, store: S, embedder: Embedder | None, index: VectorIndex, clock: Clock, limits: Limits | None = None
    ):
        super().__init__(store, embedder, index, clock, EMBED_BUDGET_SECONDS)
        self.limits = limits or Limits()

    def _title(self, value: str, field: str) -> str:
        return check_title(value, field, self.limits)

    # ---------------------------------------------------------------- write

    async def upsert_page(
        self, company: str, container: str, title: str, body: str, parent_titles: list[str], *, page_id: str = ""
    ) -> tuple[Page, bool, str | None]:
        """Create or replace the page (by container and title). Returns it, whether this call
        created it, and why it has no vector when it has none. ``page_id``: the id a page this call
        creates gets (a caller that recorded it first finds the page after a fault); a replaced
        page keeps its own."""
        new_id = _requested_id(page_id) if page_id else uuid.uuid4()
        company = require_ident(company, "company", domain=DOMAIN)
        container = require_ident(container, "container", domain=DOMAIN)
        title = self._title(title, "title")
        require_text(body, "body", domain=DOMAIN, max_chars=self.limits.body_chars)
        at_most_items(parent_titles, self.limits.parent_depth, "parent_titles", _TOO_MANY_PARENTS, domain=DOMAIN)
        parents = [self._title(t, f"parent_titles[{i}]") for i, t in enumerate(parent_titles)]
        vector, skipped = await self._vector_for(company, container, title, body)
        model = self.embedder.model if (vector is not None and self.embedder is not None) else None
        page, created = await self.store.upsert(
            PageWrite(new_id, company, container, title, body, tuple(parents), self.clock.now(), vector, model)
        )
        if vector is not None and model:
            await self._index(page, vector, model)
        return page, created, skipped

    async def _vector_for(
        self, company: str, container: str, title: str, body: str
    ) -> tuple[np.ndarray | None, str | None]:
        """The page's vector: the stored one when its text and model are unchanged (a move between
        parents re-embeds nothing), else the inline embed."""
        if self.embedder is None:
            return None, "unconfigured"
        earlier = await self.store.by_title(company, container, title)
        if earlier is not None and earlier.body == body and earlier.embedding_model == self.embedder.model:
            stored = await self.store.stored_vector(earlier.uuid)
            if stored is not None:
                return stored, None
        embedded = await self.embed_row(embedding_text(title, body))
        return embedded.values, embedded.skipped_reason

    async def _index(self, page: Page, vector: np.ndarray, model: str) -> None:
        await self.index_row(index_point(page.uuid, page.company, page.container, vector, model), "page")
