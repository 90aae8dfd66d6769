"""Wiring of the knowledge service: its migration (``knowledge_pages``), the native pages, the
org's backend (native, or Confluence routed beside the native ``workspace:`` containers), the
servicers (``agentlearn.knowledge.v1`` and the deprecated ``agentlearn.prefetch.v1`` alias), the
offline rule of the promotion distillation, and the passes (``knowledge-fill``,
``skill-promotion``)."""

from __future__ import annotations

from pathlib import Path

from libs.common.component import Component
from libs.common.config import Settings
from libs.common.db import Migrations
from libs.common.infra import Infra
from libs.common.passrunner import PassSpec
from libs.common.vector_passes import vector_row_passes
from services.knowledge import passes, promotion
from services.knowledge.backends import KnowledgeBackend, RoutedBackend, UnconfiguredBackend
from services.knowledge.confluence import ConfluenceBackend, ConfluenceClient
from services.knowledge.domain import COLLECTION_BASE
from services.knowledge.legacy import legacy_registration
from services.knowledge.native import NativePages
from services.knowledge.native_search import NativeBackend
from services.knowledge.service import KnowledgeService
from services.knowledge.servicer import knowledge_registration
from services.knowledge.store import PostgresDraftProvenance, PostgresPageStore
from services.skills.episodes import GrpcEpisodeReader

NAME = "knowledge"
MIGRATIONS = Migrations("knowledge", Path(__file__).parent / "migrations")


def build_backend(settings: Settings, native: NativeBackend) -> KnowledgeBackend:
    """``knowledge.backend``: Confluence when it has a site (``auto``), else the native pages."""
    chosen = settings.knowledge_backend()
    if chosen == "none":
        return UnconfiguredBackend()
    if chosen == "confluence":
        cfg = settings.knowledge.confluence
        assert cfg.base_url is not None  # Settings refuses confluence without a site
        client = ConfluenceClient(
            cfg.base_url,
            timeout_seconds=cfg.timeout_seconds,
            max_retries=cfg.max_retries,
            max_retry_after_seconds=cfg.max_retry_after_seconds,
        )
        return RoutedBackend(ConfluenceBackend(client, settings), native)
    return native


def build(infra: Infra) -> KnowledgeService:
    pages = NativePages(PostgresPageStore(infra.pool), infra.embedder, infra.index, infra.clock)
    native = NativeBackend(pages, infra.settings, infra.embedder, infra.index)
    return KnowledgeService(infra.settings, pages, build_backend(infra.settings, native), infra.events)


def pass_specs(service: KnowledgeService, infra: Infra) -> list[PassSpec]:
    cfg = infra.settings.learning.promotion
    episodes = GrpcEpisodeReader(lambda: infra.channels.channel("episodes"))
    distiller = promotion.Distiller(infra.aux)
    drafts = PostgresDraftProvenance(infra.pool)  # issue 17: where each draft came from
    return [
        # ``knowledge-fill`` and (issue 17: points whose page is gone leave the index,
        # docs/privacy.md) ``knowledge-orphans``.
        *vector_row_passes("knowledge", passes.PAGES, service.pages.index, infra),
        PassSpec(
            "skill-promotion",
            lambda: promotion.promote(
                infra.settings, episodes, service.backend, distiller, infra.events, drafts, infra.clock
            ),
            cfg.interval_hours * 3600,
            enabled=cfg.enabled,
        ),
    ]


def component(infra: Infra) -> Component:
    # The distillation answers with no model at all: the offline provider reads this rule.
    infra.rules.register(promotion.PURPOSE, promotion.offline_rule)
    service = build(infra)
    return Component(
        name=NAME,
        registrations=[knowledge_registration(service), legacy_registration(service)],
        service=service,
        passes=pass_specs(service, infra),
        rebuild_index=lambda: passes.rebuild_index(service.pages),
        vector_collections=[COLLECTION_BASE],
    )
