"""The knowledge backend's domain: pages, hits, search outcomes, and the rules that are data."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = [
    "AUTO_DRAFTED_PARENT",
    "AUTO_DRAFT_TITLE_PREFIX",
    "COLLECTION_BASE",
    "DOMAIN",
    "ONBOARDING_PARENT",
    "KnowledgeHit",
    "Limits",
    "Page",
    "SearchOutcome",
    "SearchStatus",
    "embedding_text",
]

DOMAIN = "prefetch.agentlearn.dev"
COLLECTION_BASE = "knowledge_pages"

AUTO_DRAFTED_PARENT = "Auto-Drafted Skills"
"""knowledge.AutoDraftedParent: the subtree cross-agent promotion files unreviewed drafts under.
No search ever returns a page in it (nor the parent page itself)."""
AUTO_DRAFT_TITLE_PREFIX = "[Auto-draft]"
"""The fail-closed backstop: a page titled so is excluded even outside the subtree."""
ONBOARDING_PARENT = "Onboarding"
"""A unit's onboarding pages sit under a page of this title (or are titled ``Onboarding…``)."""

SearchStatus = Literal["searched", "unconfigured", "scoped_to_nothing", "unreachable"]


@dataclass(frozen=True)
class Limits:
    """Bounds of a page write (refused past them, never trimmed)."""

    title_chars: int = 255
    """Confluence's title limit, kept so a page can move between backends."""
    body_chars: int = 1_000_000
    parent_depth: int = 20
    search_results: int = 20
    """The most pages one search returns (SearchKnowledge's documented maximum)."""
    onboarding_results: int = 20


@dataclass(frozen=True)
class Page:
    id: uuid.UUID
    company: str
    container: str
    title: str
    body: str
    parent_titles: tuple[str, ...]
    create_time: datetime
    update_time: datetime
    embedding_model: str | None = None
    embedding_dims: int | None = None


@dataclass(frozen=True)
class KnowledgeHit:
    """One page a search found: enough for a reader to decide whether to open it."""

    page_id: str
    title: str
    container: str
    snippet: str
    body: str = field(default="", repr=False, compare=False)
    """The whole body where the backend read it (the native one always does): search_knowledge
    shows it for a page whose title is the query, the way a model opens a page it found."""


@dataclass(frozen=True)
class SearchOutcome:
    """What a search did. ``status`` says whether it ran at all:

    - ``searched``: it ran (``hits`` may be empty: nothing in scope matched);
    - ``unconfigured``: no knowledge backend is wired;
    - ``scoped_to_nothing``: the role can read no container (or the role is unknown);
    - ``unreachable``: the store could not be read, so the search did not run and says nothing
      about what exists.
    """

    status: SearchStatus
    hits: list[KnowledgeHit] = field(default_factory=list)

    @property
    def ran(self) -> bool:
        return self.status == "searched"


def embedding_text(title: str, body: str) -> str:
    """What a page's vector is of: its title, then its body."""
    return f"{title}\n\n{body}"
