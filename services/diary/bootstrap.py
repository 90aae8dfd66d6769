"""Wiring of the diary: its migrations, its service from shared infrastructure, its servicer
registration and its passes."""

from __future__ import annotations

from pathlib import Path

from agentlearn.diary.v1 import diary_service_pb2, diary_service_pb2_grpc
from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.erasure import sweep_orphans
from libs.common.fill import VectorFill, build_fill
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.passrunner import PassSpec
from services.diary import passes
from services.diary.domain import COLLECTION_BASE
from services.diary.service import DiaryService
from services.diary.servicer import DiaryServicer
from services.diary.store import PostgresNoteStore

NAME = "diary"
MIGRATIONS = Migrations("diary", Path(__file__).parent / "migrations")
SERVICE_NAME = diary_service_pb2.DESCRIPTOR.services_by_name["DiaryService"].full_name


def build(infra: Infra) -> DiaryService:
    return DiaryService.wired(infra, PostgresNoteStore(infra.pool), infra.settings.learning.diary)


def registration(service: DiaryService) -> Registration:
    return Registration(SERVICE_NAME, diary_service_pb2_grpc.add_DiaryServiceServicer_to_server, DiaryServicer(service))


def fill(service: DiaryService, infra: Infra) -> VectorFill | None:
    return build_fill(infra, [passes.fill_source(service)])


def pass_specs(service: DiaryService, infra: Infra) -> list[PassSpec]:
    learning = infra.settings.learning
    filler = fill(service, infra)

    async def run_fill() -> object:
        indexed = await passes.index_pending(service)
        report = await filler.run_minute() if filler else None
        return {"indexed": indexed, "fill": report}

    return [
        PassSpec(
            "diary-sweep", lambda: passes.sweep(service, infra.settings.privacy), learning.diary.sweep_interval_seconds
        ),
        PassSpec("diary-fill", run_fill, learning.fill.interval_seconds),
        PassSpec(
            "diary-orphans",
            lambda: sweep_orphans(infra.pool, service.index, COLLECTION_BASE, "agent_diary"),
            infra.settings.privacy.orphan_sweep_interval_seconds,
        ),
    ]


def component(infra: Infra) -> Component:
    service = build(infra)
    return Component(
        name=NAME,
        registrations=[registration(service)],
        service=service,
        passes=pass_specs(service, infra),
        rebuild_index=lambda: passes.rebuild_index(service),
    )
