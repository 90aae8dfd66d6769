"""Real services on a loopback port for tests: real Postgres, real index adapters, real gRPC."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from libs.common.auth import Authenticator
from libs.common.clock import Clock
from libs.common.component import Component
from libs.common.config import Settings
from libs.common.grpcserver import create_server
from libs.common.infra import Infra, open_infra
from libs.common.vectorindex import VectorIndex
from services.runner.registry import SERVICES, migrations_of

__all__ = ["App", "open_app"]


@dataclass
class App:
    infra: Infra
    components: dict[str, Component]
    port: int
    channel: grpc.aio.Channel

    def passes(self) -> dict[str, Any]:
        return {p.name: p for c in self.components.values() for p in c.passes}


@contextlib.asynccontextmanager
async def open_app(
    settings: Settings,
    dsn: str,
    *,
    names: list[str] | None = None,
    clock: Clock | None = None,
    embedder: Any = None,
    index: VectorIndex | None = None,
    auth_mode: str = "local",
    address: str = "127.0.0.1:0",
) -> AsyncIterator[App]:
    """Every service of ``names`` on one loopback server (``address``: a free port unless given).
    ``auth_mode="tokens"`` authenticates every call as ``./run up --require-auth`` does (token cache
    off, so a revocation shows at once)."""
    names = names or list(SERVICES)
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, migrations_of(names), clock=clock, embedder=embedder, index=index, dsn=dsn, pool_size=5
        )
        components = {n: SERVICES[n].component(infra) for n in names}
        authenticator = Authenticator(
            infra.tokens, infra.clock, mode=auth_mode, cache_seconds=0, internal_secret=infra.internal_secret
        )
        server, port, _health = await create_server(
            [r for c in components.values() for r in c.registrations], address, authenticator=authenticator
        )
        stack.push_async_callback(server.stop, None)
        infra.channels.serve_locally(names, f"127.0.0.1:{port}")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stack.push_async_callback(channel.close)
        yield App(infra, components, port, channel)
