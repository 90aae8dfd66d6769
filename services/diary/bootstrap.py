"""Wiring of the diary: its migrations, its service from shared infrastructure, its servicer
registration and its passes."""

from __future__ import annotations

from pathlib import Path

from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.passrunner import PassSpec
from libs.common.vector_passes import vector_row_passes
from services.diary import passes
from services.diary.domain import COLLECTION_BASE
from services.diary.service import DiaryService
from services.diary.servicer import DiaryServicer
from services.diary.store import PostgresNoteStore

NAME = "diary"
MIGRATIONS = Migrations("diary", Path(__file__).parent / "migrations")


def build(infra: Infra) -> DiaryService:
    return DiaryService.wired(infra, PostgresNoteStore(infra.pool), infra.settings.learning.diary)


def registration(service: DiaryService) -> Registration:
    return Registration.of(DiaryServicer(service))


def pass_specs(service: DiaryService, infra: Infra) -> list[PassSpec]:
    sweep = PassSpec(
        "diary-sweep",
        lambda: passes.sweep(service, infra.settings.privacy),
        infra.settings.learning.diary.sweep_interval_seconds,
    )
    return [sweep, *vector_row_passes("diary", passes.NOTES, service.index, infra)]


def component(infra: Infra) -> Component:
    service = build(infra)
    return Component(
        name=NAME,
        registrations=[registration(service)],
        service=service,
        passes=pass_specs(service, infra),
        rebuild_index=lambda: passes.rebuild_index(service),
        vector_collections=[COLLECTION_BASE],
    )
