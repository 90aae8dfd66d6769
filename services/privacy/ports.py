"""The erasure use cases' ports (issue 13): what ``service.PrivacyService`` and ``worker.
ErasureWorker`` need of the ``erasures`` store, of the queue the erasure jobs wait on, and of the
owners an erasure asks. ``store.PostgresErasureStore``, ``libs.common.jobs.JobQueue`` and
``owners.GrpcOwners`` are the adapters; tests/unit/fakes/privacy.py holds in-memory ones, so the
unit tier runs an erasure's steps (collect, erase rounds, verify, done or failed) with no Postgres
and no gRPC.

An erasure's row and its job move together: ``ErasureStore.transaction()`` yields an opaque handle
(``Tx``: the asyncpg connection for the adapters, a token for the fakes) that the use cases only
pass back to the store and to the queue. Every step the run records outside a transaction is one
statement of the store's (each is resumable on its own).
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from libs.common.erasure import Kind, Report, Target
from libs.common.jobs import ClaimQueue, EnqueueQueue, PendingQueue, SettleQueue
from services.privacy.domain import Erasure, Holder

__all__ = ["ErasureQueue", "ErasureStore", "Owners", "Tx"]

Tx = Any
"""A store's transaction handle, passed back to the store and the queue and never looked into."""


class Owners(Protocol):
    """The services that own rows of a person, a seat or a company (``owners.GrpcOwners``: their
    ``EraseRows`` / ``FindRows`` RPCs)."""

    async def erase(self, owner: str, target: Target) -> Report:
        """Erase the owner's rows of ``target`` under ``target.erasure_id`` (a repeat returns the
        report it recorded)."""
        ...

    async def find(self, owner: str, target: Target) -> Report:
        """What the owner still holds of ``target`` (rows, index points, checks that could not run)."""
        ...


class ErasureStore(Protocol):
    """``erasures``: each erasure's audit row, its target while it runs, its reports."""

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """One transaction: every write made through its handle commits together, or none does."""
        ...

    async def insert(self, tx: Tx, erasure: Erasure, target: Target, request_id: str | None) -> uuid.UUID | None:
        """The new erasure's id, or None when ``request_id`` already named one of the company's
        erasures of the same kind and seat (a key is scoped to what the erasure is of)."""
        ...

    async def by_request(self, company: str, kind: Kind, seat: str, request_id: str) -> Erasure | None:
        """The erasure ``request_id`` named among the company's erasures of ``kind`` and ``seat``."""
        ...

    async def get(self, erasure_id: uuid.UUID, company: str | None = None) -> Erasure | None: ...

    async def page(
        self, company: str, after: tuple[datetime, uuid.UUID] | None, limit: int, *, seat: str | None = None
    ) -> list[Erasure]:
        """Newest first, after the cursor ``after`` (create time, id); of ``seat`` only, when named."""
        ...

    async def mark_running(self, erasure_id: uuid.UUID) -> None:
        """QUEUED becomes RUNNING (any other state stays)."""
        ...

    # The run's writes, each made only while ``holder``'s claim is held and the erasure unfinished;
    # each raises ``domain.ClaimLost`` when not (the run stops: its new holder's outcome stands).

    async def set_collected(self, holder: Holder, erasure_id: uuid.UUID, target: Target) -> None: ...

    async def next_round(self, holder: Holder, erasure_id: uuid.UUID, target: Target, round_: int) -> None:
        """The erasure goes on to ``round_`` with ``target`` (a round already recorded is kept)."""
        ...

    async def set_pending_checks(self, holder: Holder, erasure_id: uuid.UUID, checks: list[str]) -> None: ...

    async def put_report(self, holder: Holder, erasure_id: uuid.UUID, owner: str, report: Report) -> None:
        """The report of ``owner`` (a report key: ``domain.report_key``), replacing one recorded."""
        ...

    async def set_reason(self, tx: Tx, erasure_id: uuid.UUID, reason: str) -> None: ...

    async def finish(self, tx: Tx, erasure: Erasure, now: datetime) -> None:
        """The outcome ``erasure`` carries (its state, residues, verified, reason) recorded, and its
        target dropped, in one statement."""
        ...


class ErasureQueue(EnqueueQueue, ClaimQueue, SettleQueue, PendingQueue, Protocol):
    """The erasure jobs' queue (``libs.common.jobs.JobQueue``, kind ``erasure``): queued with its
    erasure's row, claimed and renewed by the worker, and every move of a claimed job fenced by the
    claim (False when it is no longer held); its depth read for ``agentlearn.queue.depth``."""
