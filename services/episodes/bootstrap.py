"""Wiring of the episodes service: its migrations, its service from shared infrastructure, its
servicer registration, its offline rules and its passes (``episode-lifecycle``, ``episode-fill``)."""

from __future__ import annotations

from pathlib import Path

from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.passrunner import PassSpec
from libs.common.vector_passes import vector_row_passes
from services.episodes import erasure, passes
from services.episodes.domain import COLLECTION_BASE
from services.episodes.lifecycle import COMPACTION_PROMPT_VERSION, EpisodeLifecycle, register_rules
from services.episodes.service import EpisodeService
from services.episodes.servicer import EpisodeServicer
from services.episodes.store import PostgresEpisodeStore

NAME = "episodes"
MIGRATIONS = Migrations("episodes", Path(__file__).parent / "migrations")


def build(infra: Infra) -> EpisodeService:
    return EpisodeService.wired(infra, PostgresEpisodeStore(infra.pool), infra.settings.learning.episodes)


def registration(service: EpisodeService, lifecycle: EpisodeLifecycle | None = None) -> Registration:
    servicer = EpisodeServicer(
        service,
        rederive=lifecycle.rederive if lifecycle is not None else None,
        prompt_version=COMPACTION_PROMPT_VERSION,
    )
    return Registration.of(servicer)


def lifecycle(service: EpisodeService, infra: Infra) -> EpisodeLifecycle:
    return EpisodeLifecycle(service, infra.aux, infra.settings.learning.episode_lifecycle, infra.events)


def pass_specs(service: EpisodeService, infra: Infra) -> list[PassSpec]:
    worker = lifecycle(service, infra)

    async def run_lifecycle() -> object:
        report = await worker.run()
        # Retention (issue 17) runs whether or not the lifecycle could (it needs no model).
        report.retention_deleted = await erasure.prune_retention(
            infra.pool, service.index, infra.settings.privacy, service.clock.now()
        )
        return report

    return [
        PassSpec("episode-lifecycle", run_lifecycle, infra.settings.learning.episode_lifecycle.interval_seconds),
        *vector_row_passes("episode", passes.RAW_EPISODES, service.index, infra),
    ]


def component(infra: Infra) -> Component:
    register_rules(infra.rules)
    service = build(infra)
    return Component(
        name=NAME,
        registrations=[registration(service, lifecycle(service, infra))],
        service=service,
        passes=pass_specs(service, infra),
        rebuild_index=lambda: passes.rebuild_index(service),
        vector_collections=[COLLECTION_BASE],
    )
