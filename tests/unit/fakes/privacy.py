"""In-memory fakes of the erasure use cases' ports (services/privacy/ports.py).

``FakeErasureDb`` holds the ``erasures`` rows (``store``: ``FakeErasureStore``) and the erasure
jobs (``queue``: ``fakes.jobs.FakeJobQueue``); a transaction that raises leaves neither moved.
Each store operation does what its statement does (``mark_running`` moves only a queued row,
``next_round`` only forward, ``finish`` drops the target).

``FakeOwners`` holds each owner's rows of people, as ``EraseRows`` / ``FindRows`` answer for them:
an owner erases the rows that name the person or carry one of the target's run ids, records its
report under the round's id (a repeat returns it), and ``find`` reports what it still holds (and
the run ids those rows carry). ``written_late`` puts rows in after an owner's first erase (a
reflection of the person that was running), ``down`` owners answer UNAVAILABLE,
``index_behind`` owners leave vector points behind, ``unsearchable`` owners' index checks cannot run.
"""

from __future__ import annotations

import copy
import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime

import grpc

from libs.common.erasure import INDEX_PREFIX, PENDING_CHECK, Kind, Report, Target
from libs.common.grpcserver import _Status, rpc_error
from libs.common.jobs import JobState
from services.privacy.domain import ClaimLost, Erasure, ErasureState, Holder
from tests.unit.fakes.jobs import FakeDb


@dataclass
class _State:
    erasures: dict[uuid.UUID, Erasure] = field(default_factory=dict)
    requests: dict[tuple[str, str, str, str], uuid.UUID] = field(default_factory=dict)
    """(company, kind, seat, request_id) -> the erasure: a key is scoped to what the erasure is of."""
    targets_dropped: set[uuid.UUID] = field(default_factory=set)


class FakeErasureDb(FakeDb):
    def __init__(self) -> None:
        self.state = _State()
        super().__init__()
        self.store = FakeErasureStore(self)


class FakeErasureStore:
    def __init__(self, db: FakeErasureDb):
        self._db = db
        self.fail: set[str] = set()
        """Operations that raise ``ConnectionError`` once (the database gone)."""

    @property
    def _s(self) -> _State:
        state: _State = self._db.state
        return state

    def _maybe_fail(self, op: str) -> None:
        if op in self.fail:
            self.fail.discard(op)
            raise ConnectionError(f"the database went away during {op}")

    def _row(self, erasure_id: uuid.UUID) -> Erasure:
        return self._s.erasures[erasure_id]

    def transaction(self) -> AbstractAsyncContextManager[FakeDb]:
        return self._db.transaction()

    async def insert(self, tx: object, erasure: Erasure, target: Target, request_id: str | None) -> uuid.UUID | None:
        key = (erasure.company, str(erasure.kind), erasure.seat, request_id or "")
        if request_id is not None and key in self._s.requests:
            return None
        row = copy.deepcopy(erasure)
        row.target = target
        self._s.erasures[erasure.id] = row
        if request_id is not None:
            self._s.requests[key] = erasure.id
        return erasure.id

    async def by_request(self, company: str, kind: Kind, seat: str, request_id: str) -> Erasure | None:
        found = self._s.requests.get((company, str(kind), seat, request_id))
        return copy.deepcopy(self._s.erasures[found]) if found is not None else None

    async def get(self, erasure_id: uuid.UUID, company: str | None = None) -> Erasure | None:
        row = self._s.erasures.get(erasure_id)
        if row is None or (company is not None and row.company != company):
            return None
        return copy.deepcopy(row)

    async def page(
        self, company: str, after: tuple[datetime, uuid.UUID] | None, limit: int, *, seat: str | None = None
    ) -> list[Erasure]:
        rows = sorted(
            (r for r in self._s.erasures.values() if r.company == company and (seat is None or r.seat == seat)),
            key=lambda r: (r.create_time, r.id),
            reverse=True,
        )
        if after is not None:
            rows = [r for r in rows if (r.create_time, r.id) < after]
        return copy.deepcopy(rows[:limit])

    async def mark_running(self, erasure_id: uuid.UUID) -> None:
        row = self._row(erasure_id)
        if row.state is ErasureState.QUEUED:
            row.state = ErasureState.RUNNING

    def _held(self, holder: Holder, erasure_id: uuid.UUID) -> Erasure:
        """The row, when ``holder``'s claim is held and the erasure unfinished (the SQL's fence)."""
        j = self._db.queue.jobs.get(holder.job_id)
        row = self._row(erasure_id)
        held = j is not None and j.state == JobState.RUNNING and j.locked_by == holder.worker
        if not held or j is None or j.job.attempts != holder.attempts or row.state.finished:
            raise ClaimLost(f"erasure {erasure_id}: the claim of {holder.worker} is no longer held")
        return row

    async def set_collected(self, holder: Holder, erasure_id: uuid.UUID, target: Target) -> None:
        row = self._held(holder, erasure_id)
        row.target, row.collected = target, True

    async def next_round(self, holder: Holder, erasure_id: uuid.UUID, target: Target, round_: int) -> None:
        row = self._held(holder, erasure_id)
        if row.round < round_:
            row.target, row.round = target, round_

    async def set_pending_checks(self, holder: Holder, erasure_id: uuid.UUID, checks: list[str]) -> None:
        self._held(holder, erasure_id).pending_checks = list(checks)

    async def put_report(self, holder: Holder, erasure_id: uuid.UUID, owner: str, report: Report) -> None:
        self._maybe_fail("put_report")
        self._held(holder, erasure_id).reports[owner] = Report.from_json(report.to_json())

    async def set_reason(self, tx: object, erasure_id: uuid.UUID, reason: str) -> None:
        self._row(erasure_id).reason = reason

    async def finish(self, tx: object, erasure: Erasure, now: datetime) -> None:
        row = self._row(erasure.id)
        row.state, row.verified, row.reason, row.finish_time = erasure.state, erasure.verified, erasure.reason, now
        row.residues = {o: Report.from_json(r.to_json()) for o, r in erasure.residues.items()}
        row.target = None  # the person's identifiers leave the audit in the same statement


@dataclass
class Row:
    """One row an owner holds: it names ``subject`` (a handle) and/or carries a run id."""

    id: str
    table: str
    subject: str = ""
    turn_id: str = ""
    session_id: str = ""


@dataclass
class FakeOwners:
    rows: dict[str, list[Row]] = field(default_factory=dict)
    written_late: dict[str, list[Row]] = field(default_factory=dict)
    """Rows an owner receives right after its first erase (a pass that was running)."""
    down: set[str] = field(default_factory=set)
    index_behind: dict[str, int] = field(default_factory=dict)
    """Vector points an owner's erase could not drop (its index was down), by owner."""
    unsearchable: set[str] = field(default_factory=set)
    recorded: dict[tuple[str, uuid.UUID], Report] = field(default_factory=dict)
    calls: list[tuple[str, str, uuid.UUID]] = field(default_factory=list)
    """(call, owner, the id it was asked under), in order."""

    def _check(self, owner: str) -> None:
        if owner in self.down:
            raise rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, f"{owner} is down"))

    @staticmethod
    def _matches(row: Row, target: Target) -> bool:
        return bool(row.subject and row.subject in target.identifiers) or bool(
            row.turn_id and row.turn_id in target.turn_ids
        )

    async def erase(self, owner: str, target: Target) -> Report:
        self.calls.append(("erase", owner, target.erasure_id))
        self._check(owner)
        known = self.recorded.get((owner, target.erasure_id))
        if known is not None:
            # A repeat returns the recorded report and drops the points once more.
            again = Report.from_json(known.to_json())
            again.index_points_pending = self.index_behind.get(owner, 0)
            return again
        rows = self.rows.get(owner, [])
        gone = [r for r in rows if self._matches(r, target)]
        self.rows[owner] = [r for r in rows if r not in gone]
        report = Report(owner)
        for table in sorted({r.table for r in gone}):
            report.add(table, [r.id for r in gone if r.table == table])
        report.index_points_pending = self.index_behind.get(owner, 0)
        self.recorded[(owner, target.erasure_id)] = report
        self.rows[owner].extend(self.written_late.pop(owner, []))
        return report

    async def find(self, owner: str, target: Target) -> Report:
        self.calls.append(("find", owner, target.erasure_id))
        self._check(owner)
        report = Report(owner)
        held = [r for r in self.rows.get(owner, []) if self._matches(r, target)]
        for table in sorted({r.table for r in held}):
            report.add(table, [r.id for r in held if r.table == table])
        report.turn_ids |= {r.turn_id for r in held if r.turn_id}
        report.session_ids |= {r.session_id for r in held if r.session_id}
        if owner in self.index_behind:
            report.add(f"{INDEX_PREFIX}{owner}", [f"point-{i}" for i in range(self.index_behind[owner])])
        if owner in self.unsearchable:
            report.add(f"{PENDING_CHECK}{owner}", [])
        return report
