"""Wiring of the inspector: its pages over the services' clients, served on the HTTP port. It has
no gRPC service of its own (its process's gRPC port serves health only) and owns no tables."""

from __future__ import annotations

from pathlib import Path

from libs.common.clients import Clients
from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.infra import Infra
from services.inspector.rpc import Gateway
from services.inspector.views import Inspector

NAME = "inspector"
MIGRATIONS = Migrations("inspector", Path(__file__).parent / "migrations")


def build(infra: Infra) -> Inspector:
    settings = infra.settings
    config = settings.inspector
    return Inspector(
        Gateway(Clients(infra.channels, config.rpc_timeout_seconds)),
        config,
        infra.clock,
        sessions=settings.sessions,
        diary=settings.learning.diary,
    )


def component(infra: Infra) -> Component:
    inspector = build(infra)
    return Component(
        name=NAME,
        registrations=[],
        service=inspector,
        http_routes=inspector.routes(),
        http_open_paths=list(Inspector.OPEN_PATHS),
    )
