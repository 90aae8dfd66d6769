"""Wiring of the sessions: migrations, the service over the shared queue, the check runner and its
writes over the other services' channels, the background worker, the gRPC servicer, the HTTP
routes, and the offline rules of the review and the memory judge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libs.common.auxmodel import OfflineRules
from libs.common.clients import Clients
from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.jobs import JobQueue
from libs.common.passrunner import holder_identity
from services.sessions import http, judge, review
from services.sessions.checks import CheckRunner
from services.sessions.service import SessionService
from services.sessions.servicer import SessionServicer
from services.sessions.store import PostgresSessionStore
from services.sessions.worker import LearningWorker
from services.sessions.writes import Writer

NAME = "sessions"
MIGRATIONS = Migrations("sessions", Path(__file__).parent / "migrations")


@dataclass
class Sessions:
    """The sessions' use cases and their background worker (operators' tools and tests reach both)."""

    service: SessionService
    worker: LearningWorker


def register_rules(rules: OfflineRules) -> None:
    """The offline provider answers the review and the memory judge, so checks run with no model."""
    rules.register(review.PURPOSE, review.offline_rule)
    rules.register(judge.PURPOSE, judge.offline_rule)


def build(infra: Infra) -> Sessions:
    settings = infra.settings
    store = PostgresSessionStore(infra.pool)
    queue = JobQueue(infra.pool)
    service = SessionService(store, queue, settings, infra.clock, infra.events)
    clients = Clients(infra.channels, settings.sessions.rpc_timeout_seconds)
    writer = Writer(clients, settings, infra.aux, store, infra.clock)
    runner = CheckRunner(store, infra.aux, writer, settings)
    worker = LearningWorker(store, queue, runner, settings.sessions, infra.clock, infra.events, holder_identity())
    return Sessions(service, worker)


def component(infra: Infra) -> Component:
    register_rules(infra.rules)
    sessions = build(infra)
    return Component(
        name=NAME,
        registrations=[Registration.of(SessionServicer(sessions.service, infra.pool))],
        service=sessions,
        background=[lambda: sessions.worker.run_forever(infra.listen_dsn)],
        http_routes=http.routes(sessions.service),
    )
