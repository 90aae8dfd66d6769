"""In-memory fakes of the reflection harness's ports (services/reflector/ports.py).

``FakeReflectionDb`` holds both halves the harness moves together: the ``reflections`` records
(``store``: ``FakeReflectionStore``) and the reflection jobs (``queue``: ``fakes.jobs.FakeJobQueue``).
They behave as the Postgres store and ``libs.common.jobs.JobQueue`` do where the harness depends on
it: every record move is checked against the one state machine (``domain.TRANSITIONS``) and a
refused one raises ``IllegalTransition``; a transaction that raises leaves neither the record nor
the job moved; every move of a claimed job is fenced by its claim (holder and attempt); a final
record is not taken again; a worker's final outcome is recorded once (``store.merge_outcomes``).

``fail`` names store operations that raise once (the database gone mid-pass), so a test can say
what the harness does about a fault of its own.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Unpack

from libs.common.budgets import BudgetRoom
from libs.common.config import BudgetConfig
from libs.common.events import Bookkeeping
from libs.common.jobs import Job, NewJob
from services.reflector.domain import (
    TRANSITIONS,
    ReflectionState,
    TurnKey,
    WorkerOutcome,
    check_transition,
    job_key,
)
from services.reflector.store import ReflectionRecord, merge_outcomes
from tests.unit.fakes.jobs import FakeDb

Key = tuple[str, str, str]


@dataclass
class _State:
    records: dict[Key, ReflectionRecord] = field(default_factory=dict)


class FakeReflectionDb(FakeDb):
    """The records and the queue, in one fake database (one transaction covers both)."""

    def __init__(self) -> None:
        self.state = _State()
        super().__init__()
        self.store = FakeReflectionStore(self)


class FakeReflectionStore:
    def __init__(self, db: FakeReflectionDb):
        self._db = db
        self.fail: set[str] = set()
        """Operations that raise ``ConnectionError`` once (then succeed)."""
        self.bookkeeping: list[Bookkeeping] = []

    def _maybe_fail(self, op: str) -> None:
        if op in self.fail:
            self.fail.discard(op)
            raise ConnectionError(f"the database went away during {op}")

    @property
    def records(self) -> dict[Key, ReflectionRecord]:
        return self._db.state.records

    def transaction(self) -> contextlib.AbstractAsyncContextManager[FakeDb]:
        return self._db.transaction()

    async def queue_turn(self, turn_id: str, **job: Unpack[NewJob]) -> bool:
        """The queue's enqueue and the record QUEUED in one transaction, as the one statement."""
        async with self._db.transaction() as tx:
            if await self._db.queue.enqueue(tx, **job) is None:
                return False
            company, seat, now = job["company"], job["seat"], job["now"]
            self.records.setdefault(
                (company, seat, turn_id),
                ReflectionRecord(company, seat, turn_id, ReflectionState.QUEUED, None, submit_time=now),
            )
        return True

    async def get(self, company: str, seat: str, turn_id: str) -> ReflectionRecord | None:
        self._maybe_fail("get")
        record = self.records.get((company, seat, turn_id))
        return copy.deepcopy(record)

    async def erased(self, company: str, seat: str, turn_id: str) -> bool:
        """Its job kept with an empty payload, as an erasure leaves it."""
        key = job_key(seat, turn_id)
        jobs = self._db.queue.jobs.values()
        return any((j.job.company, j.job.key) == (company, key) and not j.job.payload for j in jobs)

    async def take(self, company: str, seat: str, turn_id: str) -> tuple[ReflectionRecord | None, bool]:
        self._maybe_fail("take")
        record = self.records.get((company, seat, turn_id))
        if record is None:
            return None, False
        before = copy.deepcopy(record)
        if ReflectionState.RUNNING not in TRANSITIONS[record.state]:
            return before, False
        record.state, record.gate, record.reason, record.next_attempt_time = ReflectionState.RUNNING, None, None, None
        record.attempts += 1
        return before, True

    async def put_workers(self, company: str, seat: str, turn_id: str, outcomes: list[WorkerOutcome]) -> bool:
        self._maybe_fail("put_workers")
        record = self.records.get((company, seat, turn_id))
        if record is None:
            return False
        merged = merge_outcomes(record.workers, outcomes)
        if merged == record.workers:
            return False
        record.workers = merged
        return True

    def _move(self, key: TurnKey, target: ReflectionState) -> ReflectionRecord | None:
        record = self.records.get(key)
        if record is None:
            return None  # erased or past retention: the queue row moves alone
        check_transition(key.turn_id, record.state, target)
        record.state = target
        return record

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
        """The queue's finish and the record's close in one transaction, as the one statement moves both."""
        if state not in (ReflectionState.COMPLETED, ReflectionState.GATED):
            raise ValueError(f"a close ends a pass completed or gated, not {state}")
        async with self._db.transaction() as tx:
            self._maybe_fail("close")  # the statement fails: nothing moves
            if not await self._db.queue.finish(tx, job, worker, now):
                return False
            record = self._move(key, state)
            if record is not None:
                record.gate, record.complete_time, record.reason, record.next_attempt_time = gate, now, None, None
                if workers is not None:
                    record.workers = list(workers)
        return True

    async def defer(self, tx: object, key: TurnKey, gate: str, until: datetime) -> bool:
        record = self._move(key, ReflectionState.DEFERRED)
        if record is None:
            return False
        record.gate, record.next_attempt_time = gate, until
        return True

    async def retrying(
        self, tx: object, key: TurnKey, reason: str, until: datetime, workers: list[WorkerOutcome] | None = None
    ) -> bool:
        self._maybe_fail("retrying")
        record = self._move(key, ReflectionState.RETRYING)
        if record is None:
            return False
        record.reason, record.next_attempt_time = reason, until
        if workers is not None:
            record.workers = list(workers)
        return True

    async def dead_letter(
        self, tx: object, key: TurnKey, reason: str, workers: list[WorkerOutcome] | None, now: datetime
    ) -> bool:
        record = self._move(key, ReflectionState.DEAD_LETTERED)
        if record is None:
            return False
        record.reason, record.complete_time, record.next_attempt_time = reason, now, None
        if workers is not None:
            record.workers = list(workers)
        return True

    async def requeued(self, tx: object, key: TurnKey) -> bool:
        record = self.records.get(key)
        if record is None or record.state.waiting:
            return False
        self._move(key, ReflectionState.QUEUED)
        return True

    async def page(
        self, company: str, seat: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[ReflectionRecord]:
        mine = [r for r in self.records.values() if (r.company, r.seat) == (company, seat)]
        mine.sort(key=lambda r: (r.submit_time, r.turn_id), reverse=True)
        if after is not None:
            mine = [r for r in mine if r.submit_time is not None and (r.submit_time, r.turn_id) < after]
        return copy.deepcopy(mine[:limit])

    async def count(self, company: str, seat: str) -> int:
        return sum(1 for r in self.records.values() if (r.company, r.seat) == (company, seat))

    async def write_bookkeeping(self, batch: Bookkeeping) -> None:
        batch.closed = True
        self.bookkeeping.append(batch)


@dataclass
class FakeBudget:
    """The seat's and the company's spent tokens, as ``BudgetLedger.room`` reads them; ``broken``
    makes the counter unreadable."""

    seat_spent: int = 0
    company_spent: int = 0
    broken: bool = False

    async def room(self, company: str, seat: str, at: datetime, config: BudgetConfig) -> BudgetRoom:
        if self.broken:
            raise ConnectionError("the counters are unreadable")
        return BudgetRoom(
            self.seat_spent, self.company_spent, config.seat_ceiling_tokens, config.company_ceiling_tokens
        )
