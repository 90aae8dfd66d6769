"""In-memory fakes of the session use cases' ports (services/sessions/ports.py).

``FakeSessionStore`` keeps what the Postgres store keeps (sessions, events, plans, receipts) and
behaves as its queries do where the use cases depend on it: a transaction that raises leaves
nothing behind (a session created by a refused first append included), a job key is queued once,
pages are newest first after a (time, id) cursor. Its ``queue`` is the shared in-memory job queue
(``fakes.jobs``), rolled back with the store's state, so a check's job is kept only when the
receipt's transaction committed, as in Postgres.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from services.sessions.domain import (
    CheckState,
    Event,
    EventKind,
    LearningCheck,
    NewCheck,
    PlanStep,
    Session,
    SessionFilter,
    SessionSummary,
    TurnWindow,
)
from tests.unit.fakes.jobs import FakeDb, FakeJobQueue


@dataclass
class _State:
    sessions: dict[tuple[str, str], Session] = field(default_factory=dict)
    update_times: dict[tuple[str, str], datetime] = field(default_factory=dict)
    events: dict[tuple[str, str], list[Event]] = field(default_factory=dict)
    plans: dict[tuple[str, str, int], list[PlanStep]] = field(default_factory=dict)
    checks: list[LearningCheck] = field(default_factory=list)


class FakeTx:
    """One session's transaction on the fake store; ``conn`` is the transaction itself."""

    def __init__(self, state: _State, session: Session, queue: FakeJobQueue):
        self._state = state
        self.session = session
        self._queue = queue

    @property
    def conn(self) -> FakeTx:
        return self

    @property
    def _key(self) -> tuple[str, str]:
        return self.session.company, self.session.session_id

    async def seen(self, event_ids: Sequence[str]) -> set[str]:
        return {e.event_id for e in self._state.events.get(self._key, []) if e.event_id in event_ids}

    async def insert_events(self, events: Sequence[Event], now: datetime) -> list[Event]:
        seq = self.session.last_seq
        stored = []
        for e in events:
            seq += 1
            stored.append(replace(e, seq=seq))
        if stored:
            self._state.events.setdefault(self._key, []).extend(stored)
            self.session = replace(self.session, last_seq=seq)
            self._state.sessions[self._key] = self.session
            self._state.update_times[self._key] = now
        return stored

    async def plan(self, revision: int) -> list[PlanStep] | None:
        if revision <= 0:
            return []
        steps = self._state.plans.get((*self._key, revision))
        return None if steps is None else list(steps)

    async def insert_plan(self, revision: int, steps: Sequence[PlanStep], now: datetime) -> None:
        self._state.plans[(*self._key, revision)] = list(steps)
        self.session = replace(self.session, plan_revision=revision)
        self._state.sessions[self._key] = self.session
        self._state.update_times[self._key] = now

    async def turn_window(self, turn_id: str, end: Event) -> TurnWindow:
        covered = max((c.trigger_seq for c in self._checks()), default=0)
        mine = [
            e
            for e in self._state.events.get(self._key, [])
            if e.turn_id == turn_id and covered < e.seq < end.seq and e.kind is not EventKind.TURN_END
        ]
        tools = sum(1 for e in mine if e.kind is EventKind.TOOL_RESULT)
        return TurnWindow(tools, min((e.event_time for e in mine), default=None), end.event_time)

    def _checks(self) -> list[LearningCheck]:
        return [c for c in self._state.checks if (c.company, c.session_id) == self._key]

    async def active_check(self) -> LearningCheck | None:
        active = [c for c in self._checks() if c.state.active]
        return max(active, key=lambda c: (c.create_time, c.id)) if active else None

    async def insert_check(self, new: NewCheck, now: datetime) -> LearningCheck | None:
        s = self.session
        if any(c.company == s.company and c.job_key == new.job_key for c in self._state.checks):
            return None
        at = [e.event_id for e in self._state.events.get(self._key, []) if e.seq == new.trigger_seq]
        check = LearningCheck(
            id=new.id,
            company=s.company,
            session_id=s.session_id,
            owner=s.owner,
            workspace=s.workspace,
            seat=s.seat,
            role=s.role,
            trigger=new.trigger,
            plan_revision=new.plan_revision,
            turn_id=new.turn_id,
            trigger_seq=new.trigger_seq,
            trigger_event_id=at[0] if at else "",
            job_key=new.job_key,
            state=CheckState.QUEUED,
            create_time=now,
            newly_done=new.newly_done,
        )
        self._state.checks.append(check)
        return check

    async def drop_leftover_job(self, key: str, receipt: uuid.UUID) -> None:
        s = self.session
        if any(c.company == s.company and c.job_key == key and c.id != receipt for c in self._state.checks):
            return
        for job_id, j in list(self._queue.jobs.items()):
            if (j.job.kind, j.job.company, j.job.key) == ("learning", s.company, key):
                del self._queue.jobs[job_id]


class FakeSessionStore(FakeDb):
    """The store and its check queue (``queue``, for the use cases' ``CheckQueue``) in one fake
    database."""

    state: _State

    def __init__(self) -> None:
        super().__init__()
        self.state = _State()

    @contextlib.asynccontextmanager
    async def open_session(
        self, company: str, session_id: str, create: Session | None, now: datetime
    ) -> AsyncIterator[FakeTx | None]:
        async with self.transaction():
            key = (company, session_id)
            if create is not None and key not in self.state.sessions:
                self.state.sessions[key] = create
                self.state.update_times[key] = now
            session = self.state.sessions.get(key)
            yield FakeTx(self.state, session, self.queue) if session is not None else None

    async def get_session(self, company: str, session_id: str) -> Session | None:
        return self.state.sessions.get((company, session_id))

    async def sessions_page(
        self, where: SessionFilter, after: tuple[datetime, str] | None, limit: int
    ) -> list[SessionSummary]:
        out = []
        for key, s in self.state.sessions.items():
            if (
                s.company != where.company
                or (where.seat is not None and s.seat != where.seat)
                or (where.owner is not None and s.owner != where.owner)
            ):
                continue
            if where.query and where.query.lower() not in s.session_id.lower():
                continue
            updated = self.state.update_times[key]
            if after is not None and (updated, s.session_id) >= after:
                continue
            checks = sorted(
                (c for c in self.state.checks if (c.company, c.session_id) == key),
                key=lambda c: (c.create_time, c.id),
            )
            last = checks[-1] if checks else None
            out.append(
                SessionSummary(s, updated, len(checks), last.state if last else None, last.outcome if last else None)
            )
        out.sort(key=lambda r: (r.update_time, r.session.session_id), reverse=True)
        return out[:limit]

    async def checks_page(
        self, company: str, session_id: str, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[LearningCheck]:
        mine = [
            c
            for c in self.state.checks
            if (c.company, c.session_id) == (company, session_id) and (after is None or (c.create_time, c.id) < after)
        ]
        return sorted(mine, key=lambda c: (c.create_time, c.id), reverse=True)[:limit]

    def _away(self, company: str, owner: str, since: datetime, seat: str | None = None) -> list[LearningCheck]:
        return [
            c
            for c in self.state.checks
            if c.company == company
            and c.owner == owner
            and (seat is None or c.seat == seat)
            and c.finish_time is not None
            and c.finish_time >= since
            and not c.state.active
        ]

    async def away_page(
        self,
        company: str,
        owner: str,
        since: datetime,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        *,
        seat: str | None = None,
    ) -> list[LearningCheck]:
        done = [c for c in self._away(company, owner, since, seat) if after is None or (c.finish_time, c.id) < after]
        return sorted(done, key=lambda c: (c.finish_time, c.id), reverse=True)[:limit]

    async def lesson_by_page(self, company: str, page_id: str) -> tuple[str, str, Any] | None:
        return None  # lessons are written by the writer against Postgres; none in memory

    async def away_counts(
        self, company: str, owner: str, since: datetime, *, seat: str | None = None
    ) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self._away(company, owner, since, seat):
            counts[str(c.state)] = counts.get(str(c.state), 0) + 1
        return counts

    # ---------------------------------------------------------------- what the worker would do

    def finish(self, check_id: uuid.UUID, state: CheckState, now: datetime) -> None:
        """A check run to its end (the worker's part, outside the use cases under test)."""
        for c in self.state.checks:
            if c.id == check_id:
                c.state, c.finish_time = state, now
