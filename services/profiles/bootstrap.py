"""Wiring of the profiles service: its migrations, its service from shared infrastructure and its
servicer registration. It has no background passes: profiles are never swept or embedded."""

from __future__ import annotations

from pathlib import Path

from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from services.profiles.service import ProfileService
from services.profiles.servicer import ProfileServicer
from services.profiles.store import PostgresProfileStore

NAME = "profiles"
MIGRATIONS = Migrations("profiles", Path(__file__).parent / "migrations")


def build(infra: Infra) -> ProfileService:
    return ProfileService(store=PostgresProfileStore(infra.pool), clock=infra.clock, events=infra.events)


def registration(service: ProfileService, infra: Infra) -> Registration:
    return Registration.of(ProfileServicer(service, infra.pool))


def component(infra: Infra) -> Component:
    service = build(infra)
    return Component(name=NAME, registrations=[registration(service, infra)], service=service)
