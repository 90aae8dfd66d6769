"""The backend seam inside the knowledge service, and how a deployment's backend is chosen.

``KnowledgeBackend`` is what the native pages and Confluence both implement: a best-effort
search, reads by id and by listing, the onboarding pages, and the ``PromotionWriter`` half
(``existing_draft`` / ``write_draft``). The service resolves who may read what (``scope``) and
hands the backend an :class:`Access`; every backend excludes the Auto-Drafted Skills subtree from
searches itself, and the service re-checks every page it returns.

- ``native``: pages in PostgreSQL (the embedded default).
- ``confluence``: CQL over REST as the seat's own user (the spec's default when configured),
  routed beside the native pages for ``workspace:<name>`` containers, which only native pages
  hold (session learning's project lessons): :class:`RoutedBackend`.
- ``none``: :class:`UnconfiguredBackend`, every search "not configured".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from libs.common.config import WORKSPACE_CONTAINER_PREFIX
from libs.common.embeddings import Vector
from services.knowledge.domain import (
    Access,
    KnowledgeHit,
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

__all__ = [
    "BackendUnavailable",
    "KnowledgeBackend",
    "PromotionRefused",
    "PromotionWriter",
    "RoutedBackend",
    "UnconfiguredBackend",
]

_log = logging.getLogger(__name__)


class BackendUnavailable(Exception):
    """A read that could not run, and why (the same reasons a search reports)."""

    def __init__(self, reason: UnsearchedReason, detail: str = "", retry_after: float | None = None):
        super().__init__(detail or str(reason))
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


class PromotionRefused(Exception):
    """The writer will not file the draft (e.g. the Auto-Drafted Skills parent cannot be created,
    and a draft at the space root would be read by every agent)."""


class PromotionWriter(Protocol):
    """learning.PromotionWriter: where cross-agent promotion files drafts. Dedup is the writer's
    (keyed on the title, unique within a space), so a tick that finds its draft stays quiet."""

    async def existing_draft(self, company: str, container: str, title: str) -> PromotionResult | None:
        """The page of that title in the container (draft or published), or None. Raises
        :class:`BackendUnavailable` when the backend cannot say."""
        ...

    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        """File the draft under the container's Auto-Drafted Skills page (created when missing), or
        answer the page of that title already there (``created`` False). Raises on a write failure
        (:class:`PromotionRefused`, :class:`BackendUnavailable`): nothing is announced."""
        ...


class KnowledgeBackend(PromotionWriter, Protocol):
    mode: ServedMode | None
    """Which backend this is (None: none configured)."""

    def can_search(self, access: Access) -> bool:
        """No I/O: could a search with this access return anything?"""
        ...

    async def search(self, access: Access, query: str, limit: int, *, vector: Vector | None = None) -> SearchOutcome:
        """Best effort, never raises; drafts excluded. Scoped to ``access``. ``vector``: one the
        caller already has for this search (a backend that ranks by meaning may use it rather than
        embed ``query`` again; one of another model is ignored)."""
        ...

    async def get_page(self, access: Access, page_id: str) -> Page | None:
        """The page, read as ``access``'s credential; None when there is none it can see. Raises
        :class:`BackendUnavailable`. The caller checks container and draft visibility."""
        ...

    async def list_pages(self, access: Access, query: PageQuery) -> PageListing:
        """Pages of ``query.containers`` (None: every container, operators only) in (container,
        title) order from ``query.cursor``. Raises :class:`BackendUnavailable`."""
        ...

    async def onboarding(self, access: Access, containers: Sequence[str], limit: int) -> SearchOutcome:
        """The Onboarding pages of ``containers`` (own unit first), drafts excluded."""
        ...


class UnconfiguredBackend:
    """No knowledge backend: nothing can be searched and every search says so."""

    mode: ServedMode | None = None

    def can_search(self, access: Access) -> bool:
        return False

    async def search(self, access: Access, query: str, limit: int, *, vector: Vector | None = None) -> SearchOutcome:
        return SearchOutcome.did_not_run(UnsearchedReason.UNCONFIGURED, "no knowledge backend is configured")

    async def get_page(self, access: Access, page_id: str) -> Page | None:
        return None

    async def list_pages(self, access: Access, query: PageQuery) -> PageListing:
        return PageListing((), None)

    async def onboarding(self, access: Access, containers: Sequence[str], limit: int) -> SearchOutcome:
        return SearchOutcome.did_not_run(UnsearchedReason.UNCONFIGURED, "no knowledge backend is configured")

    async def existing_draft(self, company: str, container: str, title: str) -> PromotionResult | None:
        raise BackendUnavailable(UnsearchedReason.UNCONFIGURED, "no knowledge backend is configured")

    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        raise PromotionRefused("no knowledge backend is configured")


_HALF = "half"
_NATIVE_HALF = "native"
"""A mixed listing's cursor where the native workspaces start (see ``RoutedBackend.list_pages``)."""


def _workspace(container: str) -> bool:
    return container.startswith(WORKSPACE_CONTAINER_PREFIX)


def _interleave(first: Sequence[KnowledgeHit], second: Sequence[KnowledgeHit], limit: int) -> tuple[KnowledgeHit, ...]:
    """Two ranked lists as one: alternate, best of each first (neither backend's scores are
    comparable with the other's)."""
    out: list[KnowledgeHit] = []
    for i in range(max(len(first), len(second))):
        out += [h for h in (first[i] if i < len(first) else None, second[i] if i < len(second) else None) if h]
    return tuple(out[:limit])


class RoutedBackend:
    """Confluence for spaces, the native pages for ``workspace:<name>`` containers (which only
    native pages hold). The search runs on both halves of the reader's scope; if the primary half
    did not run, the whole search did not run — a search that saw only part of the company's
    pages must not claim "nothing matched" about the rest."""

    def __init__(self, primary: KnowledgeBackend, native: KnowledgeBackend):
        self.primary = primary
        self.native = native
        self.mode = primary.mode

    @staticmethod
    def _split(access: Access) -> tuple[Access | None, Access]:
        """The reader's scope as Confluence's half (None: it has none) and the native half. A
        reader whose containers are all ``workspace:`` ones has no space: its Confluence half is
        None, not an empty list of spaces — which, for a seat with a credential of its own, would
        read as "no container at all" and search every space its user can see."""
        spaces = tuple(c for c in access.containers if not _workspace(c))
        workspaces = tuple(c for c in access.containers if _workspace(c))
        primary = Access(access.reader, spaces, access.own_credential) if spaces or access.unscoped else None
        native = Access(access.reader, workspaces, False)
        return primary, native

    def can_search(self, access: Access) -> bool:
        primary, native = self._split(access)
        return (primary is not None and self.primary.can_search(primary)) or (
            bool(native.containers) and self.native.can_search(native)
        )

    async def search(self, access: Access, query: str, limit: int, *, vector: Vector | None = None) -> SearchOutcome:
        primary, native = self._split(access)
        ask_native = bool(native.containers)
        if primary is None:
            if not ask_native:
                return SearchOutcome.did_not_run(UnsearchedReason.SCOPED_TO_NOTHING)
            return await self.native.search(native, query, limit, vector=vector)
        ask_primary = self.primary.can_search(primary)
        if not ask_native:
            return await self.primary.search(primary, query, limit, vector=vector)
        if not ask_primary:
            return await self.native.search(native, query, limit, vector=vector)
        first, second = await asyncio.gather(
            self.primary.search(primary, query, limit, vector=vector),
            self.native.search(native, query, limit, vector=vector),
        )
        if not first.ran:
            return first
        if not second.ran:
            return second
        return SearchOutcome(first.served, None, _interleave(first.hits, second.hits, limit))

    def _for_id(self, page_id: str) -> KnowledgeBackend:
        return self.native if is_native_id(page_id) else self.primary

    async def get_page(self, access: Access, page_id: str) -> Page | None:
        return await self._for_id(page_id).get_page(access, page_id)

    async def list_pages(self, access: Access, query: PageQuery) -> PageListing:
        """One backend's listing when the containers are all of it; a reader whose containers mix
        spaces and ``workspace:`` ones lists Confluence's spaces first, then the native workspaces.
        The cursor says which half it is in by its shape: Confluence's ``{"start"}``, the native
        ``{"c", "t", "id"}`` (also what the service writes when it cuts a FULL page short), or
        ``{"half": "native"}`` for the native half from its start. A page never mixes the halves
        (the service's body budget applies to native pages alone), so the page on which
        Confluence's spaces end may be short."""
        if query.containers is None:
            return await self.primary.list_pages(access, query)
        spaces = tuple(c for c in query.containers if not _workspace(c))
        workspaces = tuple(c for c in query.containers if _workspace(c))
        if not spaces:
            return await self.native.list_pages(access, query)
        if not workspaces:
            return await self.primary.list_pages(access, query)
        cursor = query.cursor
        if cursor is None or "start" in cursor:
            listing = await self.primary.list_pages(access, replace(query, containers=spaces))
            if listing.next_cursor is not None:
                return listing
            if listing.pages:
                return PageListing(listing.pages, {_HALF: _NATIVE_HALF})
            cursor = None  # no space had a page: the workspaces' first page answers
        elif cursor.get(_HALF) == _NATIVE_HALF:
            cursor = None
        return await self.native.list_pages(access, replace(query, containers=workspaces, cursor=cursor))

    async def onboarding(self, access: Access, containers: Sequence[str], limit: int) -> SearchOutcome:
        return await self.primary.onboarding(access, containers, limit)

    async def existing_draft(self, company: str, container: str, title: str) -> PromotionResult | None:
        backend = self.native if _workspace(container) else self.primary
        return await backend.existing_draft(company, container, title)

    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        backend = self.native if _workspace(draft.container_key) else self.primary
        return await backend.write_draft(draft)
