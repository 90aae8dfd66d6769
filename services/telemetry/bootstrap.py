"""Wiring of the telemetry service: the read side of the shared event log. It writes nothing and
runs no passes; its one migration is an index for its own reads."""

from __future__ import annotations

from pathlib import Path

from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from services.telemetry.service import TelemetryService
from services.telemetry.servicer import TelemetryServicer
from services.telemetry.store import PostgresEventReader

NAME = "telemetry"
MIGRATIONS = Migrations("telemetry", Path(__file__).parent / "migrations")


def build(infra: Infra) -> TelemetryService:
    return TelemetryService(PostgresEventReader(infra.pool), infra.clock)


def component(infra: Infra) -> Component:
    service = build(infra)
    return Component(
        name=NAME,
        registrations=[Registration.of(TelemetryServicer(service))],
        service=service,
    )
