"""The knowledge service's domain: pages, hits, readers, search outcomes, and the rules that are data.

Everything that crosses the ``Searcher`` seam is a frozen dataclass or an enum here — no status
strings, no ``getattr`` — so the native backend, the Confluence backend, the gRPC client the
prefetch holds and the servicer all speak one vocabulary.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

__all__ = [
    "AUTO_DRAFTED_PARENT",
    "AUTO_DRAFT_TITLE_PREFIX",
    "COLLECTION_BASE",
    "DOMAIN",
    "ONBOARDING_PARENT",
    "Access",
    "DraftOrigin",
    "KnowledgeHit",
    "Limits",
    "Page",
    "PageListing",
    "PromotionDraft",
    "PromotionResult",
    "ReadContext",
    "ReadSource",
    "Reader",
    "SearchOutcome",
    "ServedMode",
    "UnsearchedReason",
    "embedding_text",
    "is_auto_draft",
    "is_native_id",
]

DOMAIN = "knowledge.agentlearn.dev"
COLLECTION_BASE = "knowledge_pages"

AUTO_DRAFTED_PARENT = "Auto-Drafted Skills"
"""knowledge.AutoDraftedParent: the subtree cross-agent promotion files unreviewed drafts under.
No seat ever reads a page in it (nor the parent page itself)."""
AUTO_DRAFT_TITLE_PREFIX = "[Auto-draft]"
"""The fail-closed backstop: a page titled so is hidden even outside the subtree (a backend whose
parent chain could not be read still cannot leak a draft)."""
ONBOARDING_PARENT = "Onboarding"
"""A unit's onboarding pages sit under a page of this title (or are titled ``Onboarding…``)."""


def _fold(text: str) -> str:
    return text.strip().casefold()


def is_auto_draft(title: str, parent_titles: Sequence[str]) -> bool:
    """A page of the Auto-Drafted Skills subtree (at any depth), the parent page itself, or a page
    titled ``[Auto-draft]…``. Case- and blank-insensitive on purpose: fail closed on a parent typed
    "auto-drafted skills "."""
    parent = _fold(AUTO_DRAFTED_PARENT)
    return (
        any(_fold(t) == parent for t in parent_titles)
        or _fold(title) == parent
        or title.lstrip().casefold().startswith(AUTO_DRAFT_TITLE_PREFIX.casefold())
    )


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def is_native_id(page_id: str) -> bool:
    """Native pages have UUIDs; Confluence's are numbers. The id says which backend holds a page."""
    return bool(_UUID.match(page_id))


class ServedMode(StrEnum):
    """The backend that answered a read."""

    NATIVE = "native"
    CONFLUENCE = "confluence"


class UnsearchedReason(StrEnum):
    """Why a search did not run. Every one of them says nothing about what the company has written
    down, so none may be rendered as "nothing matched"."""

    UNCONFIGURED = "unconfigured"
    SCOPED_TO_NOTHING = "scoped_to_nothing"
    UNREACHABLE = "unreachable"
    CREDENTIAL_REFUSED = "credential_refused"
    RATE_LIMITED = "rate_limited"


class ReadSource(StrEnum):
    """What a read was for, on its ``knowledge_read`` event."""

    GET_PAGE = "get_page"
    LIST_PAGES = "list_pages"
    SEARCH_PAGES = "search_pages"
    ONBOARDING = "onboarding"
    RELEVANT_KNOWLEDGE = "relevant_knowledge"
    SEARCH_KNOWLEDGE = "search_knowledge"
    TOOL_SKILL_CATALOGUE = "tool_skill_catalogue"
    INSPECTOR = "inspector"


@dataclass(frozen=True)
class ReadContext:
    source: ReadSource
    turn_id: str = ""


@dataclass(frozen=True)
class Reader:
    """Who reads: a seat with its role, a role alone (``seat`` empty: no per-seat permission), or
    an operator (both empty: every page, drafts included; needs the inspect scope)."""

    company: str
    seat: str = ""
    role: str = ""

    @property
    def operator(self) -> bool:
        return not self.seat and not self.role


@dataclass(frozen=True)
class Access:
    """What a reader may read, resolved from the settings (no I/O): the containers, whether the
    backend runs as the seat's own user, and whether that user may search unscoped."""

    reader: Reader
    containers: tuple[str, ...]
    own_credential: bool = False
    """The seat has a backend credential of its own (Confluence): its reads run as that user."""

    @property
    def operator(self) -> bool:
        return self.reader.operator

    @property
    def unscoped(self) -> bool:
        """A seat with its own credential and no container searches everything that user can read
        (the backend enforces the permissions); an operator reads everything."""
        return self.operator or (self.own_credential and not self.containers)

    def may_read(self, container: str) -> bool:
        return self.unscoped or container in self.containers

    @property
    def any(self) -> bool:
        return bool(self.containers) or self.unscoped


@dataclass(frozen=True)
class Limits:
    """Bounds of a page write (refused past them, never trimmed) and of reads."""

    title_chars: int = 255
    """Confluence's title limit, kept so a page can move between backends."""
    body_chars: int = 1_000_000
    parent_depth: int = 20
    search_results: int = 20
    """The most pages one search returns (SearchPages' documented maximum)."""
    onboarding_results: int = 20
    list_page_size: int = 50
    list_page_max: int = 200
    full_page_size: int = 10
    full_page_max: int = 50
    full_page_body_bytes: int = 2_000_000
    """A FULL listing stops adding pages past this many bytes of bodies (gRPC's 4 MB message)."""


@dataclass(frozen=True)
class Page:
    id: str
    company: str
    container: str
    title: str
    body: str
    parent_titles: tuple[str, ...]
    update_time: datetime | None
    backend: ServedMode
    create_time: datetime | None = None
    embedding_model: str | None = None
    embedding_dims: int | None = None

    @property
    def draft(self) -> bool:
        return is_auto_draft(self.title, self.parent_titles)

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self.id)


@dataclass(frozen=True)
class PageListing:
    pages: tuple[Page, ...]
    next_cursor: dict[str, object] | None
    """Where the next page starts (the servicer signs it into a page token); None at the end."""


@dataclass(frozen=True)
class PageQuery:
    """What a listing asks a backend for: one object so that every backend (and the seam's
    Protocol) takes the same listing arguments without restating them."""

    containers: Sequence[str] | None
    """None: every container (operators only)."""
    parent_title: str | None
    include_drafts: bool
    cursor: dict[str, object] | None
    """A decoded page token, as the backend that wrote it shaped it; None from the start."""
    size: int
    with_body: bool


@dataclass(frozen=True)
class KnowledgeHit:
    """One page a search found: enough for a reader to decide whether to open it."""

    page_id: str
    title: str
    container: str
    snippet: str
    body: str = field(default="", repr=False, compare=False)
    """The whole body where the backend read it; the service keeps it only on a hit whose title is
    the query (search_knowledge shows that page whole, the way a model opens a page it found)."""


@dataclass(frozen=True)
class SearchOutcome:
    """What a search did. Exactly one of ``served`` (it ran; ``hits`` may be empty: nothing in
    scope matched) and ``unsearched`` (it did not run, and says nothing about what exists)."""

    served: ServedMode | None
    unsearched: UnsearchedReason | None = None
    hits: tuple[KnowledgeHit, ...] = ()
    detail: str = ""

    def __post_init__(self) -> None:
        if (self.served is None) == (self.unsearched is None):
            raise ValueError("a search outcome is either served or unsearched")

    @property
    def ran(self) -> bool:
        return self.served is not None

    @classmethod
    def did_not_run(cls, reason: UnsearchedReason, detail: str = "") -> SearchOutcome:
        return cls(None, reason, (), detail)


@dataclass(frozen=True)
class PromotionDraft:
    company: str
    unit: str
    container_key: str
    """The unit's wiki space, never its tracker project."""
    title: str
    """The writer's dedup key (unique within a space)."""
    body: str
    """Markdown; Confluence stores it as storage-format XHTML."""
    tool_sequence: tuple[str, ...]
    """The cluster's representative run."""
    sibling_count: int
    """Runs in the converging cluster."""
    distinct_agents: int
    """Distinct seats behind them (what makes it a team's practice, not one seat's habit)."""


@dataclass(frozen=True)
class PromotionResult:
    page_id: str
    page_title: str
    created: bool
    """False when the draft already existed (the tick stays quiet)."""
    backend: ServedMode


def embedding_text(title: str, body: str) -> str:
    """What a native page's vector is of: its title, then its body."""
    return f"{title}\n\n{body}"


@dataclass(frozen=True)
class DraftOrigin:
    """A promotion draft's provenance (issue 17): what a writer records (``draft_provenance``) and
    what ``GetDraftProvenance`` reads back, one record for both."""

    company: str
    page_id: str
    backend: str
    container: str
    title: str
    unit: str
    sources: tuple[tuple[str, str], ...]
    """(seat, run id) of every run of the converging cluster."""
    provenance: str
    """The ``agentlearn.common.v1.Provenance`` JSON: run ids, model, prompt version, writer."""
    record_time: datetime
