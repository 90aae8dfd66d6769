"""The one wiring point for shared infrastructure: Postgres, the embedder, the vector index, the
auxiliary seam, events, budgets, leases and the clock.

``open_infra`` opens each client inside the caller's ``AsyncExitStack`` (closed in reverse
order); with no ``database_url`` it starts the embedded PostgreSQL under ``data_dir``. Tests pass
their own adapters (a ManualClock, qdrant-client local mode, an embedder pointed at a scripted
server) instead of patching anything.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from libs.common.auth import TokenStore
from libs.common.auxmodel import AuxiliaryModel, OfflineRules, build_providers
from libs.common.budgets import BudgetLedger
from libs.common.channels import ServiceChannels
from libs.common.clock import Clock, SystemClock
from libs.common.config import Settings
from libs.common.db import COMMON_MIGRATIONS, Migrations, connect_pool, migrate, pending_migrations
from libs.common.embedded_pg import start_embedded_postgres
from libs.common.embeddings import Embedder, build_embedder
from libs.common.events import PostgresEventLog
from libs.common.fill import PostgresRequestLedger, RequestBudget
from libs.common.leases import LeaseClaimer, PostgresLeaseClaimer
from libs.common.validation import load_page_token_key, use_page_token_key
from libs.common.vectorindex import VectorIndex, build_vector_index

__all__ = ["Infra", "SchemaBehind", "open_infra", "resolve_dsn"]


class SchemaBehind(RuntimeError):
    """The process may not migrate and the schema is not current: a one-line reason."""


_log = logging.getLogger(__name__)
_UNSET = object()


@dataclass
class Infra:
    settings: Settings
    dsn: str
    pool: asyncpg.Pool
    clock: Clock
    events: PostgresEventLog
    embedder: Embedder | None
    index: VectorIndex
    budget: BudgetLedger
    leases: LeaseClaimer
    rules: OfflineRules
    aux: AuxiliaryModel
    channels: ServiceChannels
    """Clients of the other services (see ``libs.common.channels``)."""
    fill_requests: RequestBudget
    """The vector fill's per-minute request count and the provider's "not now", shared by every fill
    of every process on the database (``fill_requests``)."""
    internal_secret: str
    """What this process's services present to each other (``auth.internal_secret``, or a random
    one for this process when unset)."""
    tokens: TokenStore
    """Caller credentials (``./run token``)."""
    listen_dsn: str = ""
    """Where queue workers LISTEN (``database.listen_url``, else the database URL)."""


async def resolve_dsn(settings: Settings) -> str:
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await start_embedded_postgres(Path(settings.data_dir) / "postgres")


async def open_infra(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    migrations: Sequence[Migrations],
    *,
    clock: Clock | None = None,
    embedder: Embedder | object | None = _UNSET,
    index: VectorIndex | None = None,
    dsn: str | None = None,
    pool_size: int | None = None,
    embeds: bool = True,
) -> Infra:
    """Open what ``migrations``' services share. ``embeds=False`` (no service of the process ever
    embeds) builds no embedder: ``Infra.embedder`` is ``None``. A built local embedder is not
    loaded here: the model loads on its first embed, or when the runner warms it."""
    dsn = dsn or await resolve_dsn(settings)
    components = [COMMON_MIGRATIONS, *migrations]
    if settings.database.migrate_on_start:
        await migrate(dsn, components)
    elif pending := await pending_migrations(
        dsn, components, statement_cache_size=settings.database.statement_cache_size
    ):
        raise SchemaBehind(
            f"the database schema is behind ({len(pending)} migrations pending, first {pending[0]}): "
            "run ./run migrate (database.migrate_on_start is false)"
        )
    pool = await connect_pool(
        dsn,
        max_size=pool_size or settings.database.pool_size,
        statement_cache_size=settings.database.statement_cache_size,
    )
    stack.push_async_callback(pool.close)
    clock = clock or SystemClock()
    # Every replica signs and verifies page tokens with the deployment's one key.
    secret = settings.auth.page_token_secret
    use_page_token_key(await load_page_token_key(pool, secret.get_secret_value() if secret else None, clock.now()))
    events = PostgresEventLog(pool, clock)
    if embedder is _UNSET:
        embedder = build_embedder(settings.providers.embeddings) if embeds else None
        close = getattr(embedder, "close", None)
        if close is not None:
            stack.push_async_callback(close)
    if index is None:
        index = build_vector_index(settings)
        stack.push_async_callback(index.close)
    budget = BudgetLedger(pool)
    if settings.leases.backend == "kubernetes":
        from libs.common.k8s_leases import KubernetesLeaseClaimer

        leases: LeaseClaimer = KubernetesLeaseClaimer.from_settings(settings.leases, clock)
    else:
        leases = PostgresLeaseClaimer(pool, clock)
    rules = OfflineRules()
    providers = build_providers(settings, rules)
    for provider in providers.values():
        close = getattr(provider, "close", None)
        if close is not None:
            stack.push_async_callback(close)
    aux = AuxiliaryModel(settings, providers, budget, events, clock)
    secret = settings.auth.internal_secret
    internal_secret = secret.get_secret_value() if secret is not None else secrets.token_urlsafe(32)
    channels = ServiceChannels(
        settings.services, internal_secret=internal_secret, caller=settings.telemetry.service_name
    )
    stack.push_async_callback(channels.close)
    return Infra(
        settings=settings,
        dsn=dsn,
        pool=pool,
        clock=clock,
        events=events,
        embedder=embedder,  # type: ignore[arg-type]  # _UNSET was replaced above; mypy cannot narrow a sentinel object
        index=index,
        budget=budget,
        leases=leases,
        rules=rules,
        aux=aux,
        channels=channels,
        fill_requests=PostgresRequestLedger(pool),
        internal_secret=internal_secret,
        tokens=TokenStore(pool, clock),
        listen_dsn=(
            settings.database.listen_url.get_secret_value() if settings.database.listen_url is not None else dsn
        ),
    )
