"""The harness's and the service's ports (issue 13): what the reflection use cases (``harness.
Harness``, ``service.ReflectorService``) need of the reflection store and of the queue, as
``typing.Protocol``s. ``store.PostgresReflectionStore`` and ``libs.common.jobs.JobQueue`` are the
adapters; tests/unit/fakes/reflector_store.py holds in-memory ones, so the unit tier runs the
harness's decisions (gates, retry/defer/dead-letter, a turn reflected once) with no Postgres.

A record's move and its queue row's move commit together (the queue row is the record's state's
projection, ``domain.ReflectionState.job_state``): ``ReflectionStore.transaction()`` yields an
opaque handle (``Tx``: the asyncpg connection for the adapters, a token for the fakes) that the
harness only passes back to the store and to the queue. How a move is guarded (one statement whose
``WHERE`` names the allowed sources) is the store's job, not the port's: the port promises that a
move the state machine refuses raises :class:`~services.reflector.domain.IllegalTransition` inside
the transaction, so the queue row's move rolls back with it.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol, Unpack

from libs.common.budgets import BudgetRoom
from libs.common.config import BudgetConfig
from libs.common.events import Bookkeeping
from libs.common.jobs import ClaimManyQueue, HeldQueue, Job, NewJob, PendingQueue, SettleQueue
from services.reflector.domain import ReflectionState, TurnKey, WorkerOutcome
from services.reflector.store import ReflectionRecord

__all__ = ["Budget", "ReflectionQueue", "ReflectionStore", "Tx"]

Tx = Any
"""A store's transaction handle, passed back to the store and the queue and never looked into."""


class ReflectionStore(Protocol):
    """Each turn's reflection record (one per company, seat and run id) and its workers' outcomes."""

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """One transaction: every move made through its handle commits together, or none does."""
        ...

    async def queue_turn(self, turn_id: str, **job: Unpack[NewJob]) -> bool:
        """The turn's ``job`` queued and its record (run id ``turn_id``, the job's company and seat)
        QUEUED, committed together on their own; False when the job was queued before (nothing is
        written: the duplicate gate). A store may write the current bookkeeping batch's announced
        events (``libs.common.events.Bookkeeping.announce``) in the same commit, only if the job was
        queued; those it did not write are left in the batch for the caller to emit."""
        ...

    async def get(self, company: str, seat: str, turn_id: str) -> ReflectionRecord | None: ...

    async def erased(self, company: str, seat: str, turn_id: str) -> bool:
        """The turn's reflection was erased: its job is kept with its payload emptied (the duplicate
        gate an erasure leaves, ``services/reflector/erasure.py``). Asked only when there is no
        record."""
        ...

    async def take(self, company: str, seat: str, turn_id: str) -> tuple[ReflectionRecord | None, bool]:
        """A worker takes the turn (its claim already holds the queue row): RUNNING and one more
        attempt. Returns the record as it was and whether it moved: a final record does not (a
        redelivery, the duplicate gate); no record, (None, False)."""
        ...

    async def put_workers(self, company: str, seat: str, turn_id: str, outcomes: list[WorkerOutcome]) -> bool:
        """Record several workers' outcomes together, each merged in as
        :func:`~services.reflector.store.merge_outcome` (a final outcome already recorded is kept);
        False when nothing changed."""
        ...

    async def finish_and_close(
        self,
        job: Job,
        worker: str,
        key: TurnKey,
        state: ReflectionState,
        gate: str | None,
        now: datetime,
        workers: list[WorkerOutcome] | None = None,
    ) -> bool:
        """The turn's pass is over: the claimed ``job`` finished (``SettleQueue.finish``) and its record
        closed COMPLETED or GATED (``workers``, when given, its whole list of outcomes), committed
        together on their own: both move or neither does. False when the claim is no longer held
        (nothing moved); a close the state machine refuses raises
        :class:`~services.reflector.domain.IllegalTransition` with nothing moved; no record (erased or
        past retention), the job finishes alone. A store may write the current bookkeeping batch (its
        held rows and announced events) in the same commit, only if the job finished; else the held
        rows stay in the batch and the announcements are dropped."""
        ...

    async def defer(self, tx: Tx, key: TurnKey, gate: str, until: datetime) -> bool: ...

    async def retrying(
        self, tx: Tx, key: TurnKey, reason: str, until: datetime, workers: list[WorkerOutcome] | None = None
    ) -> bool: ...

    async def dead_letter(
        self, tx: Tx, key: TurnKey, reason: str, workers: list[WorkerOutcome] | None, now: datetime
    ) -> bool:
        """Given up; ``workers`` None keeps the outcomes recorded (a turn whose payload is unreadable
        never ran one)."""
        ...

    async def requeued(self, tx: Tx, key: TurnKey) -> bool:
        """A pass handed back when its process stops: QUEUED again. A record not yet taken (stopped
        between the claim and the take) already waits where it is: nothing to move."""
        ...

    async def page(
        self, company: str, seat: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[ReflectionRecord]:
        """Newest submitted first, after the cursor ``after`` (submit time, run id)."""
        ...

    async def count(self, company: str, seat: str) -> int: ...

    async def write_bookkeeping(self, batch: Bookkeeping) -> None:
        """A pass's held events and charges, written together (best effort)."""
        ...


class ReflectionQueue(ClaimManyQueue, SettleQueue, PendingQueue, HeldQueue, Protocol):
    """The reflection jobs' queue (``libs.common.jobs.JobQueue``, kind ``reflection``): the queue's
    operations as libs.common.jobs states them, those the harness uses (a turn is queued with its
    record by the store: ``ReflectionStore.queue_turn``)."""


class Budget(Protocol):
    """The token counters the no-budget gate reads (``libs.common.budgets.BudgetLedger``)."""

    async def room(self, company: str, seat: str, at: datetime, config: BudgetConfig) -> BudgetRoom: ...
