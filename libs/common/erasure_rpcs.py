"""EraseRows and FindRows (issue 17), the two RPCs every component's service carries for the
privacy service's erasure, written once.

Each servicer restated them: read the target (a bad one refused in the component's own domain),
run the component's erase or find pass, answer with the report. Only the passes differ; a servicer
names them in :class:`ErasureCalls` and inherits :class:`ErasureRpcs` before its generated base
(the generated methods answer UNIMPLEMENTED).

Only the privacy service's erasure job may call them (a service credential), or anyone in local
mode: an erasure is asked of the privacy service, which records who asked and verifies the owners
erased. A token, ``admin`` included, could otherwise erase an owner's rows (or read which rows name
a person) with no audit row and no verification, so each RPC refuses it before anything is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import asyncpg

from libs.common import text_caches
from libs.common.auth import current_principal
from libs.common.clock import Clock
from libs.common.erasure import Report, Target, report_to_proto, target_from_proto
from libs.common.errors import PermissionDenied
from libs.common.rpctypes import ServicerContext

__all__ = [
    "Clocked",
    "ErasureCalls",
    "ErasureRpcs",
    "IndexedErasure",
    "PoolErasure",
    "indexed_erasure",
    "pool_erasure",
    "require_service_credential",
]

PRIVACY_RPCS = "agentlearn.privacy.v1.PrivacyService EraseSubject, EraseSeat or EraseCompany"
"""Where an erasure is requested instead (protos/agentlearn/privacy/v1/privacy_service.proto)."""


def require_service_credential(rpc: str, domain: str) -> None:
    """Refuse ``rpc`` to every caller but another service (the privacy service's erasure job) and
    local mode. The proto's ``admin`` scope alone let an admin token through: the interceptor
    passes it before the handler, so the check is here, once for every owner."""
    if current_principal().trusted:
        return
    raise PermissionDenied(
        f"{rpc} answers only the privacy service's erasure job (a service credential), never a token, "
        f"admin included: request an erasure with {PRIVACY_RPCS}, which records who asked and verifies it",
        reason="SERVICE_CREDENTIAL_REQUIRED",
        domain=domain,
        metadata={"rpc": rpc},
    )


@dataclass(frozen=True)
class ErasureCalls:
    """What a component's erasure RPCs run and answer with."""

    domain: str
    """The component's error domain: a malformed target is refused in it."""
    erase: Callable[[Target], Awaitable[Report]]
    find: Callable[[Target], Awaitable[Report]]
    erase_response: Callable[..., Any]
    """The component's generated EraseRowsResponse (each proto declares its own)."""
    find_response: Callable[..., Any]

    @classmethod
    def of(
        cls,
        domain: str,
        pb: Any,
        erase: Callable[[Target], Awaitable[Report]],
        find: Callable[[Target], Awaitable[Report]],
    ) -> ErasureCalls:
        """The calls answering with ``pb``'s (the component's generated messages module) responses."""
        return cls(domain, erase, find, pb.EraseRowsResponse, pb.FindRowsResponse)


class PoolErasure(Protocol):
    """A component's erasure module whose passes need only its pool (and the time, to erase)."""

    async def erase(self, pool: asyncpg.Pool, target: Target, now: datetime, /) -> Report: ...
    async def find(self, pool: asyncpg.Pool, target: Target, /) -> Report: ...


class Clocked(Protocol):
    """What holds a component's clock (its service, or its deps): read at each call, so a clock
    set after wiring is the one an erasure stamps."""

    @property
    def clock(self) -> Clock: ...


def pool_erasure(
    module: PoolErasure,
    pool: Callable[[], asyncpg.Pool],
    clocked: Clocked,
    *,
    domain: str,
    pb: Any,
) -> ErasureCalls:
    """The calls of a component whose erasure reads and writes only its pool's tables. ``pool`` and
    ``clocked.clock`` are read at each call (the service's pool and clock, not the ones at wiring
    time); ``pb`` is the component's generated messages module."""
    return ErasureCalls.of(
        domain,
        pb,
        erase=lambda target: module.erase(pool(), target, clocked.clock.now()),
        find=lambda target: module.find(pool(), target),
    )


class IndexedErasure(Protocol):
    """A component's erasure module whose passes read its pool and its vector index (the rows and
    their points), finding by the subject's embedded names too."""

    async def erase(self, pool: asyncpg.Pool, index: Any, target: Target, now: datetime, /) -> Report: ...
    async def find(self, pool: asyncpg.Pool, target: Target, index: Any, embedder: Any, /) -> Report: ...


def indexed_erasure(module: IndexedErasure, rows: Callable[[], Any], *, domain: str, pb: Any) -> ErasureCalls:
    """The calls of a component whose rows are vector-indexed. ``rows`` answers, at each call, what
    holds them: its ``store.pool``, ``index``, ``embedder`` and ``clock`` (the service, or its pages)."""

    def erase(target: Target) -> Awaitable[Report]:
        held = rows()
        return module.erase(held.store.pool, held.index, target, held.clock.now())

    def find(target: Target) -> Awaitable[Report]:
        held = rows()
        return module.find(held.store.pool, target, held.index, held.embedder)

    return ErasureCalls.of(domain, pb, erase=erase, find=find)


class ErasureRpcs:
    """EraseRows and FindRows over a servicer's :attr:`_erasure_calls` (set in its ``__init__``)."""

    _erasure_calls: ErasureCalls

    async def EraseRows(self, request: Any, context: ServicerContext) -> Any:
        calls = self._erasure_calls
        require_service_credential("EraseRows", calls.domain)
        report = await calls.erase(target_from_proto(request.target, domain=calls.domain))
        # The in-memory caches of people's text (query vectors, note words) are emptied once the
        # rows are gone, this process's and every other replica's (told through PostgreSQL), so
        # nothing of the erased text outlives the erasure in them.
        await text_caches.clear_everywhere()
        return calls.erase_response(report=report_to_proto(report))

    async def FindRows(self, request: Any, context: ServicerContext) -> Any:
        calls = self._erasure_calls
        require_service_credential("FindRows", calls.domain)
        report = await calls.find(target_from_proto(request.target, domain=calls.domain))
        return calls.find_response(report=report_to_proto(report))
