"""Wiring of the privacy service (issue 17): its migrations, the coordinator over the owners'
channels, the erasure worker on the shared queue, and the gRPC servicer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libs.common.clients import Clients
from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.jobs import JobQueue
from libs.common.passrunner import holder_identity
from services.privacy.owners import GrpcOwners
from services.privacy.service import PrivacyService
from services.privacy.servicer import PrivacyServicer
from services.privacy.store import PostgresErasureStore
from services.privacy.worker import ErasureWorker

NAME = "privacy"
MIGRATIONS = Migrations("privacy", Path(__file__).parent / "migrations")


@dataclass
class Privacy:
    """The use cases and the erasure worker (operators' tools and tests reach both)."""

    service: PrivacyService
    worker: ErasureWorker
    clients: Clients


def build(infra: Infra) -> Privacy:
    config = infra.settings.privacy
    queue = JobQueue(infra.pool)
    clients = Clients(infra.channels, config.rpc_timeout_seconds)
    owners = GrpcOwners(clients)
    service = PrivacyService(PostgresErasureStore(infra.pool), queue, owners, infra.clock, infra.events, config)
    worker = ErasureWorker(service, queue, config, infra.clock, infra.events, holder_identity())
    return Privacy(service, worker, clients)


def component(infra: Infra) -> Component:
    privacy = build(infra)
    return Component(
        name=NAME,
        registrations=[Registration.of(PrivacyServicer(privacy.service, privacy.clients))],
        service=privacy,
        background=[lambda: privacy.worker.run_forever(infra.listen_dsn)],
    )
