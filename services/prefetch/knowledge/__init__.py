"""Knowledge search: the ``Searcher`` seam and its native backend (pages in PostgreSQL).

- ``Searcher`` (``can_search`` with no I/O, best-effort ``search``, ``onboarding_pages``) and
  ``build_searcher(infra)``, which wires :class:`NativeSearcher`; :class:`UnconfiguredSearcher`
  is the searcher of a deployment with no backend (every search answers ``unconfigured``).
- ``render_search_result(outcome, query)``: the ``search_knowledge`` tool's answer in words.
- ``KnowledgeService`` (UpsertPage / GetPage use cases), ``build_knowledge(infra)``,
  ``KnowledgeServicer`` and ``knowledge_registration(service)`` for the gRPC server.
- ``knowledge_pass_specs`` / ``rebuild_index``: the ``knowledge-fill`` pass and the index rebuild.
- ``PromotionWriter`` (the seam cross-agent promotion writes drafts through) and
  ``NativePromotionWriter``; not called yet.

See ``docs/services/knowledge.md``.
"""

from services.prefetch.knowledge.domain import (
    AUTO_DRAFT_TITLE_PREFIX,
    AUTO_DRAFTED_PARENT,
    COLLECTION_BASE,
    DOMAIN,
    ONBOARDING_PARENT,
    KnowledgeHit,
    Limits,
    Page,
    SearchOutcome,
    SearchStatus,
)
from services.prefetch.knowledge.passes import fill_source, index_pending, knowledge_pass_specs, rebuild_index
from services.prefetch.knowledge.promotion import (
    NativePromotionWriter,
    PromotionDraft,
    PromotionResult,
    PromotionWriter,
)
from services.prefetch.knowledge.render import render_search_result
from services.prefetch.knowledge.searcher import (
    NativeSearcher,
    Searcher,
    UnconfiguredSearcher,
    build_searcher,
    role_containers,
)
from services.prefetch.knowledge.service import KnowledgeService
from services.prefetch.knowledge.servicer import (
    KnowledgeServicer,
    hit_to_pb,
    knowledge_registration,
    page_to_pb,
    status_to_pb,
)
from services.prefetch.knowledge.store import PostgresPageStore, StoreUnavailable

__all__ = [
    "AUTO_DRAFTED_PARENT",
    "AUTO_DRAFT_TITLE_PREFIX",
    "COLLECTION_BASE",
    "DOMAIN",
    "ONBOARDING_PARENT",
    "KnowledgeHit",
    "KnowledgeService",
    "KnowledgeServicer",
    "Limits",
    "NativePromotionWriter",
    "NativeSearcher",
    "Page",
    "PostgresPageStore",
    "PromotionDraft",
    "PromotionResult",
    "PromotionWriter",
    "SearchOutcome",
    "SearchStatus",
    "Searcher",
    "StoreUnavailable",
    "UnconfiguredSearcher",
    "build_knowledge",
    "build_searcher",
    "fill_source",
    "hit_to_pb",
    "index_pending",
    "knowledge_pass_specs",
    "knowledge_registration",
    "page_to_pb",
    "rebuild_index",
    "render_search_result",
    "role_containers",
    "status_to_pb",
]


def build_knowledge(infra) -> KnowledgeService:  # type: ignore[no-untyped-def]
    """The page use cases over the shared pool, embedder, index and clock."""
    return KnowledgeService(PostgresPageStore(infra.pool), infra.embedder, infra.index, infra.clock)
