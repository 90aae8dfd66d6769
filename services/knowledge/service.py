"""The knowledge use cases: scope every read to its reader, hide drafts from seats, record what
was read, and write pages and promotion drafts.

- **Scope** is resolved from the settings with no I/O (``scope.access_of``). A seat (or a role)
  never reads a page outside its containers nor one of the Auto-Drafted Skills subtree: such a
  page is NOT_FOUND to it, exactly as a page that does not exist. A reader naming neither seat nor
  role is an operator (the inspector, an admin tool): every page of the company, drafts included,
  and it needs the ``inspect`` scope (``admin`` and the services' own calls have it) and a
  credential bound to no seat or user.
- **Search** is best effort: the outcome says whether it ran (``SearchOutcome``), never raises, and
  a search past ``knowledge.search_timeout_seconds`` did not run.
- **knowledge_read**: every read that reached pages — GetPage, ListPages, SearchPages, the
  onboarding list — records one event naming them (company, seat, turn, source, query, pages).
  Best effort: a failed write is logged and the read answers anyway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from libs.common.auth import current_principal
from libs.common.config import Settings
from libs.common.embeddings import Vector
from libs.common.errors import FailedPrecondition, NotFound, PermissionDenied, Unavailable, field_error
from libs.common.events import EventSink
from libs.common.not_found import not_found_error, require_found
from libs.common.validation import require_ident, require_page_id, require_text
from services.knowledge.backends import BackendUnavailable, KnowledgeBackend
from services.knowledge.domain import (
    DOMAIN,
    Access,
    DraftOrigin,
    KnowledgeHit,
    Limits,
    Page,
    PageListing,
    PageQuery,
    PromotionDraft,
    PromotionResult,
    ReadContext,
    Reader,
    SearchOutcome,
    ServedMode,
    UnsearchedReason,
)
from services.knowledge.native import NativePages, check_title
from services.knowledge.scope import access_of, clean
from services.knowledge.store import PostgresDraftProvenance

__all__ = ["KnowledgeService", "unavailable_error"]

_log = logging.getLogger(__name__)
_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


def unavailable_error(err: BackendUnavailable) -> Exception:
    """A read that could not run, as the caller's status: a refused credential is the operator's
    to fix (FAILED_PRECONDITION), anything else passes (UNAVAILABLE, retryable)."""
    metadata: dict[str, object] = {"reason": str(err.reason)}
    if err.retry_after is not None:
        metadata["retry_after_seconds"] = f"{err.retry_after:g}"
    if err.reason is UnsearchedReason.CREDENTIAL_REFUSED:
        return FailedPrecondition(err.detail, reason="KNOWLEDGE_CREDENTIAL_REFUSED", domain=DOMAIN, metadata=metadata)
    if err.reason is UnsearchedReason.UNCONFIGURED:
        return FailedPrecondition(err.detail, reason="KNOWLEDGE_UNCONFIGURED", domain=DOMAIN, metadata=metadata)
    reason = "KNOWLEDGE_RATE_LIMITED" if err.reason is UnsearchedReason.RATE_LIMITED else "KNOWLEDGE_UNREACHABLE"
    return Unavailable(
        err.detail or "the knowledge backend could not be read", reason=reason, domain=DOMAIN, metadata=metadata
    )


@dataclass
class KnowledgeService:
    settings: Settings
    pages: NativePages
    """Native page writes (UpsertPage), whatever the search backend."""
    backend: KnowledgeBackend
    """The org's backend: reads, searches, onboarding and promotion drafts."""
    events: EventSink
    limits: Limits = field(default_factory=Limits)

    @property
    def confluence(self) -> bool:
        return self.backend.mode is ServedMode.CONFLUENCE

    # ------------------------------------------------------------------ readers

    def reader(self, reader: Reader) -> Reader:
        company = require_ident(reader.company, "reader.company", domain=DOMAIN)
        seat = reader.seat.strip()
        if seat:
            seat = require_ident(seat, "reader.seat", domain=DOMAIN)
        return Reader(company, seat, reader.role.strip())

    def access(self, reader: Reader) -> Access:
        """No I/O: what ``reader`` may read (``CanSearch``)."""
        return access_of(self.settings, reader, confluence=self.confluence)

    def _operator_access(self, reader: Reader) -> Access:
        """An operator's read: every page, drafts included, only with the inspect scope and a
        credential bound to the company alone (a token bound to a seat reads as that seat)."""
        self._require_operator()
        return Access(reader, ())

    def _checked_access(self, reader: Reader) -> Access:
        """What ``reader`` may search (``access``), an operator's only past the operator's checks:
        an operator's search is unscoped (on Confluence every space, as the org token), so a
        search, a CanSearch and an onboarding read are refused to a caller that may not read as
        one, exactly as GetPage and ListPages are."""
        if reader.operator:
            self._require_operator()
        return self.access(reader)

    def _require_operator(self) -> None:
        principal = current_principal()
        if not principal.allows("inspect"):
            raise PermissionDenied(
                "reading as an operator (no seat, no role) needs the inspect scope; a seat names itself and "
                "its role and reads what they may",
                reason="SCOPE_MISSING",
                domain=DOMAIN,
                metadata={"scope": "inspect"},
            )
        principal.require_company_wide("reading as an operator (no seat, no role)")

    def can_search(self, reader: Reader) -> tuple[bool, Access]:
        access = self._checked_access(self.reader(reader))
        return self.backend.can_search(access), access

    # ------------------------------------------------------------------ knowledge_read

    async def _read(
        self, reader: Reader, context: ReadContext, pages: Sequence[Page | KnowledgeHit], query: str | None = None
    ) -> None:
        """One knowledge_read per read that reached pages, naming them."""
        if not pages:
            return
        named = []
        for p in pages:
            if isinstance(p, Page):
                named.append({"page_id": p.id, "title": p.title, "container": p.container})
            else:
                named.append({"page_id": p.page_id, "title": p.title, "container": p.container})
        await self.events.emit(
            "knowledge_read",
            company=reader.company,
            seat=reader.seat or None,
            turn_id=context.turn_id or None,
            source=str(context.source),
            role=reader.role or None,
            query=query,
            pages=named,
        )

    # ------------------------------------------------------------------ writes

    async def upsert_page(
        self, company: str, container: str, title: str, body: str, parent_titles: list[str], *, page_id: str = ""
    ) -> tuple[Page, bool, str | None]:
        return await self.pages.upsert_page(company, container, title, body, parent_titles, page_id=page_id)

    async def draft_provenance(self, company: str, page_id: str) -> DraftOrigin:
        """Where a promotion draft came from (issue 17): its unit, the runs (seat, run id) of the
        converging cluster, the distillation's model and prompt version. A page no promotion of
        the company filed is NOT_FOUND (another company's included). The runs are every seat's:
        a token bound to one seat or user is refused."""
        current_principal().require_company_wide("a promotion draft's provenance")
        company = require_ident(company, "company", domain=DOMAIN)
        page_id = require_page_id(page_id, domain=DOMAIN)
        origin = await PostgresDraftProvenance(self.pages.store.pool).get(company, page_id)
        message = f"no promotion draft of company {company} is filed as page {page_id}"
        return require_found(
            origin, "draft", page_id, seat=company, scope="company", id_key="page_id", message=message, domain=DOMAIN
        )

    async def write_promotion_draft(
        self,
        draft: PromotionDraft,
        sources: Sequence[tuple[str, str]] = (),
        provenance: dict[str, object] | None = None,
    ) -> PromotionResult:
        """File the draft; with ``sources`` ((seat, run id) of each run) or a ``provenance`` (the
        ``Provenance`` JSON as a dict), a draft this call creates has them recorded (issue 17)."""
        require_ident(draft.company, "company", domain=DOMAIN)
        require_text(draft.unit, "unit", domain=DOMAIN, max_chars=200)
        require_ident(draft.container_key, "container_key", domain=DOMAIN)
        check_title(draft.title, "title", self.limits)
        require_text(draft.body, "body", domain=DOMAIN, max_chars=self.limits.body_chars)
        for i, (seat, turn) in enumerate(sources):
            require_ident(seat, f"sources[{i}].seat", domain=DOMAIN)
            require_text(turn, f"sources[{i}].turn_id", domain=DOMAIN, max_chars=200)
        try:
            result = await self.backend.write_draft(draft)
        except BackendUnavailable as err:
            raise unavailable_error(err) from err
        if result.created and (sources or provenance):
            recorded = dict(provenance or {})
            recorded.setdefault("turn_ids", [turn for _, turn in sources])
            recorded.setdefault("writer", "write_promotion_draft")
            await PostgresDraftProvenance(self.pages.store.pool).record(
                DraftOrigin(
                    draft.company,
                    result.page_id,
                    str(result.backend),
                    draft.container_key,
                    result.page_title,
                    draft.unit,
                    tuple(sources),
                    json.dumps({k: v for k, v in recorded.items() if v}),
                    self.pages.clock.now(),
                )
            )
        return result

    # ------------------------------------------------------------------ reads

    def _not_found(self, reader: Reader, page_id: str) -> NotFound:
        message = f"page {page_id} not found in company {reader.company}"
        return not_found_error("page", page_id, seat=reader.company, scope="company", message=message, domain=DOMAIN)

    async def get_page(self, reader: Reader, page_id: str, context: ReadContext) -> Page:
        reader = self.reader(reader)
        page_id = require_text(page_id, "page_id", domain=DOMAIN, max_chars=200).strip()
        access = self._operator_access(reader) if reader.operator else self.access(reader)
        try:
            page = await self.backend.get_page(access, page_id)
        except BackendUnavailable as err:
            raise unavailable_error(err) from err
        # A seat never learns a draft or a page outside its scope exists: the same NOT_FOUND.
        if page is None or (not access.operator and (page.draft or not access.may_read(page.container))):
            raise self._not_found(reader, page_id)
        await self._read(reader, context, [page])
        return page

    async def list_pages(
        self,
        reader: Reader,
        container: str,
        parent_title: str,
        include_drafts: bool,
        full: bool,
        size: int,
        cursor: dict[str, object] | None,
        context: ReadContext,
    ) -> PageListing:
        reader = self.reader(reader)
        container = container.strip()
        if container:
            container = require_ident(container, "container", domain=DOMAIN)
        parent = parent_title.strip() or None
        if reader.operator:
            access = self._operator_access(reader)
        else:
            if include_drafts:
                raise PermissionDenied(
                    "only an operator (no seat, no role, the inspect scope) may list drafts",
                    reason="DRAFTS_OPERATOR_ONLY",
                    domain=DOMAIN,
                    metadata={"field": "include_drafts"},
                )
            access = self.access(reader)
        containers: tuple[str, ...] | None
        if container:
            # A container the reader may not read lists as empty, as a page it may not read is not found.
            if not access.may_read(container):
                return PageListing((), None)
            containers = (container,)
        elif access.operator or access.unscoped:
            if self.confluence:
                raise field_error(
                    "container", "FIELD_REQUIRED", "container is required to list Confluence pages", domain=DOMAIN
                )
            containers = None
        else:
            containers = access.containers
            if not containers:
                return PageListing((), None)
        try:
            listing = await self.backend.list_pages(
                access, PageQuery(containers, parent, include_drafts and access.operator, cursor, size, full)
            )
        except BackendUnavailable as err:
            raise unavailable_error(err) from err
        pages = listing.pages
        if not access.operator:
            pages = tuple(p for p in pages if not p.draft and access.may_read(p.container))
        next_cursor = listing.next_cursor
        if full and pages and pages[0].backend is ServedMode.NATIVE:
            # Bodies past the budget wait for the next page (gRPC's message limit); a listing by
            # (container, title, id) resumes after the last page kept. Confluence pages by offset,
            # and its pages are bounded by the page size alone.
            kept: list[Page] = []
            used = 0
            for p in pages:
                used += len(p.body.encode())
                if kept and used > self.limits.full_page_body_bytes:
                    break
                kept.append(p)
            if len(kept) < len(pages):
                pages = tuple(kept)
                next_cursor = {"c": kept[-1].container, "t": kept[-1].title, "id": kept[-1].id}
        await self._read(reader, context, pages)
        return PageListing(pages, next_cursor)

    async def search(
        self, reader: Reader, query: str, limit: int, context: ReadContext, *, vector: Vector | None = None
    ) -> SearchOutcome:
        """Best effort: never raises past the request's own checks. ``vector``: the caller's vector for
        this search (the turn's ask, embedded once a turn), used by the native vector half in place of
        embedding ``query`` when it is of the backend's model."""
        reader = self.reader(reader)
        require_text(query, "query", domain=DOMAIN, max_chars=4000)
        if limit < 0:
            raise field_error(
                "limit", "LIMIT_OUT_OF_RANGE", f"limit must not be negative, got {limit}", domain=DOMAIN, value=limit
            )
        limit = limit or self.settings.learning.prefetch.knowledge_results
        limit = max(1, min(limit, self.limits.search_results))
        access = self._checked_access(reader)
        if self.backend.mode is None:
            return await self.backend.search(access, query, limit, vector=vector)
        if not self.backend.can_search(access):
            return SearchOutcome.did_not_run(UnsearchedReason.SCOPED_TO_NOTHING)
        try:
            async with asyncio.timeout(self.settings.knowledge.search_timeout_seconds):
                outcome = await self.backend.search(access, query, limit, vector=vector)
        except TimeoutError:
            _log.warning("knowledge search for %s passed its deadline", reader)
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, "the search did not finish in time")
        except Exception:  # best effort by contract: a bug here must not fail the turn
            _log.exception("knowledge search for %s failed", reader)
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, "the search failed")
        if not outcome.ran:
            return outcome
        # The whole body only for a hit whose title is the query: the way a model opens a page.
        hits = tuple(
            h
            if (h.body and _norm(h.title) == _norm(query))
            else KnowledgeHit(h.page_id, h.title, h.container, h.snippet)
            for h in outcome.hits[:limit]
        )
        await self._read(reader, context, hits, query=query)
        return SearchOutcome(outcome.served, None, hits)

    def unit_containers(self, company: str, unit_chain: Sequence[str]) -> list[str]:
        """The containers of a unit chain: each unit's configured space, else the unit's name."""
        mapping = self.settings.company(company).knowledge.unit_containers
        return clean([mapping.get(u.strip(), u.strip()) for u in unit_chain])

    async def onboarding(self, reader: Reader, unit_chain: Sequence[str], context: ReadContext) -> SearchOutcome:
        reader = self.reader(reader)
        for i, unit in enumerate(unit_chain):
            if not unit.strip():
                raise field_error(f"unit_chain[{i}]", "FIELD_REQUIRED", f"unit_chain[{i}] is empty", domain=DOMAIN)
        containers = self.unit_containers(reader.company, unit_chain)
        access = self._checked_access(reader)
        try:
            async with asyncio.timeout(self.settings.knowledge.search_timeout_seconds):
                outcome = await self.backend.onboarding(access, containers, self.limits.onboarding_results)
        except TimeoutError:
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, "the onboarding pages did not load in time")
        if outcome.ran:
            await self._read(reader, context, outcome.hits)
        return outcome
