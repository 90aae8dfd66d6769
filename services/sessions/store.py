"""PostgreSQL store of ``chat_sessions``, ``session_events``, ``session_plans``,
``learning_checks`` and ``workspace_lessons``: named queries, ``$n`` parameters, driver errors kept
inside.

Every write to a session runs in a :class:`SessionTx`: a transaction holding the session's row lock,
so sequence numbers, plan revisions and "at most one queued or running check" hold under races, and
a check queued by a write commits (with its job) in the same transaction as the write.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.sessions.v1 import session_service_pb2 as sessions_pb
from libs.common.outcomes import from_proto, to_proto
from libs.common.rows import RowReader
from services.sessions.domain import (
    CheckOutcome,
    CheckState,
    CheckTrigger,
    Disposition,
    Dropped,
    Event,
    EventKind,
    EventStatus,
    FailureKind,
    LearningCheck,
    NewCheck,
    Output,
    OutputKind,
    PartialFailure,
    PlanStep,
    Session,
    SessionFilter,
    SessionSummary,
    StepStatus,
    TurnOutcome,
    TurnWindow,
)

__all__ = ["SQL", "LessonRecord", "PostgresSessionStore", "SessionTx"]

_SESSION = "company, session_id, owner, workspace, seat, role, last_seq, plan_revision, create_time"
_EVENT = "seq, event_id, kind, text, event_time, turn_id, tool_name, source, status, turn_outcome, remember"
_CHECK = """id, company, session_id, owner, workspace, seat, role, trigger, plan_revision, newly_done, turn_id,
            trigger_seq, trigger_event_id, job_key, state, outcome, reason, outputs, dropped, partial_failures,
            evidence, create_time, start_time, finish_time"""

SQL = {
    "create_session": """
        INSERT INTO chat_sessions (company, session_id, owner, workspace, seat, role, create_time, update_time)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
        ON CONFLICT (company, session_id) DO NOTHING""",
    "lock_session": f"SELECT {_SESSION} FROM chat_sessions WHERE company = $1 AND session_id = $2 FOR UPDATE",
    "get_session": f"SELECT {_SESSION} FROM chat_sessions WHERE company = $1 AND session_id = $2",
    "seen_events": """
        SELECT event_id FROM session_events WHERE company = $1 AND session_id = $2 AND event_id = ANY($3::text[])""",
    "insert_event": """
        INSERT INTO session_events (company, session_id, seq, event_id, kind, text, event_time, turn_id, tool_name,
                                    source, status, turn_outcome, remember, record_time)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)""",
    "advance": "UPDATE chat_sessions SET last_seq = $3, update_time = $4 WHERE company = $1 AND session_id = $2",
    "set_plan_revision": """
        UPDATE chat_sessions SET plan_revision = $3, update_time = $4 WHERE company = $1 AND session_id = $2""",
    "plan": "SELECT steps FROM session_plans WHERE company = $1 AND session_id = $2 AND revision = $3",
    "insert_plan": """
        INSERT INTO session_plans (company, session_id, revision, steps, save_time)
        VALUES ($1, $2, $3, $4::jsonb, $5)""",
    # The substantial-turn window: the turn's events after the last check's trigger point.
    "turn_window": """
        SELECT count(*) FILTER (WHERE kind = 'tool_result') AS tool_results, min(event_time) AS start_time
        FROM session_events
        WHERE company = $1 AND session_id = $2 AND turn_id = $3 AND seq > $4 AND seq < $5 AND kind <> 'turn_end'""",
    "covered_seq": """
        SELECT coalesce(max(trigger_seq), 0) FROM learning_checks WHERE company = $1 AND session_id = $2""",
    "event_id_at": "SELECT event_id FROM session_events WHERE company = $1 AND session_id = $2 AND seq = $3",
    "insert_check": f"""
        INSERT INTO learning_checks (id, company, session_id, owner, workspace, seat, role, trigger, plan_revision,
                                     newly_done, turn_id, trigger_seq, trigger_event_id, job_key, state, create_time)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 'queued', $15)
        ON CONFLICT (company, job_key) DO NOTHING
        RETURNING {_CHECK}""",
    # A learning job whose key no receipt holds (the caller just took the key for a new receipt).
    "drop_leftover_job": """
        DELETE FROM background_jobs j WHERE j.kind = 'learning' AND j.company = $1 AND j.key = $2
           AND NOT EXISTS (SELECT 1 FROM learning_checks c WHERE c.company = $1 AND c.job_key = $2 AND c.id <> $3)""",
    "active_check": f"""
        SELECT {_CHECK} FROM learning_checks
        WHERE company = $1 AND session_id = $2 AND state IN ('queued', 'running')
        ORDER BY create_time DESC, id DESC LIMIT 1""",
    "get_check": f"SELECT {_CHECK} FROM learning_checks WHERE id = $1",
    # The index of a company's sessions, most recently active first, with each one's checks by
    # count and its newest check's state.
    "sessions_page": """
        SELECT s.company, s.session_id, s.owner, s.workspace, s.seat, s.role, s.last_seq, s.plan_revision,
               s.create_time, s.update_time,
               (SELECT count(*) FROM learning_checks c
                 WHERE c.company = s.company AND c.session_id = s.session_id) AS check_count,
               l.state AS last_state, l.outcome AS last_outcome
        FROM chat_sessions s
        LEFT JOIN LATERAL (
            SELECT state, outcome FROM learning_checks c
            WHERE c.company = s.company AND c.session_id = s.session_id
            ORDER BY create_time DESC, id DESC LIMIT 1
        ) l ON true
        WHERE s.company = $1 AND ($2::text IS NULL OR s.seat = $2) AND ($3::text IS NULL OR s.owner = $3)
          AND ($4::text = '' OR strpos(lower(s.session_id), lower($4)) > 0)
          AND ($5::timestamptz IS NULL OR (s.update_time, s.session_id) < ($5, $6::text))
        ORDER BY s.update_time DESC, s.session_id DESC LIMIT $7""",
    "checks_page": f"""
        SELECT {_CHECK} FROM learning_checks
        WHERE company = $1 AND session_id = $2
          AND ($3::timestamptz IS NULL OR (create_time, id) < ($3, $4::uuid))
        ORDER BY create_time DESC, id DESC LIMIT $5""",
    "away_page": f"""
        SELECT {_CHECK} FROM learning_checks
        WHERE company = $1 AND owner = $2 AND finish_time IS NOT NULL AND finish_time >= $3
          AND state IN ('completed', 'failed', 'interrupted')
          AND ($4::timestamptz IS NULL OR (finish_time, id) < ($4, $5::uuid))
          AND ($7::text IS NULL OR seat = $7)
        ORDER BY finish_time DESC, id DESC LIMIT $6""",
    "away_counts": """
        SELECT state, count(*) FROM learning_checks
        WHERE company = $1 AND owner = $2 AND finish_time IS NOT NULL AND finish_time >= $3
          AND state IN ('completed', 'failed', 'interrupted') AND ($4::text IS NULL OR seat = $4)
        GROUP BY state""",
    "start_check": """
        UPDATE learning_checks SET state = 'running', start_time = $2
        WHERE id = $1 AND state = 'queued' RETURNING id""",
    "finish_check": """
        UPDATE learning_checks
           SET state = $2, outcome = $3, reason = $4, outputs = $5::jsonb, dropped = $6::jsonb,
               partial_failures = $7::jsonb, evidence = $8::jsonb, finish_time = $9,
               start_time = coalesce(start_time, $9)
         WHERE id = $1 AND state IN ('queued', 'running') RETURNING id""",
    # A check whose job was interrupted (its process died): reported, with what it had written.
    "interrupt_check": """
        UPDATE learning_checks SET state = 'interrupted', outcome = 'interrupted', reason = $3, finish_time = $4
         WHERE company = $1 AND job_key = $2 AND state IN ('queued', 'running') RETURNING id""",
    # A worker that finished after its claim lapsed: the receipt stays interrupted, with what it wrote.
    "annotate_interrupted": """
        UPDATE learning_checks
           SET outputs = $2::jsonb, dropped = $3::jsonb, partial_failures = $4::jsonb, evidence = $5::jsonb,
               reason = reason || $6
         WHERE id = $1 AND state = 'interrupted'""",
    "unfinished": f"""
        SELECT {_CHECK} FROM learning_checks WHERE state IN ('queued', 'running')
        ORDER BY create_time LIMIT $1""",
    # The newest records of some kinds at or before the trigger (the evidence bounds).
    "latest_of_kinds": f"""
        SELECT * FROM (
            SELECT {_EVENT} FROM session_events
            WHERE company = $1 AND session_id = $2 AND kind = ANY($3::text[]) AND seq <= $4
            ORDER BY seq DESC LIMIT $5) e
        ORDER BY seq""",
    "count_of_kinds": """
        SELECT count(*) FROM session_events
        WHERE company = $1 AND session_id = $2 AND kind = ANY($3::text[]) AND seq <= $4""",
    "lesson_by_page": """
        SELECT workspace, title, sources FROM workspace_lessons WHERE company = $1 AND page_id = $2
        ORDER BY create_time LIMIT 1""",
    # The lesson's record, committed before its page is written (Writer.lesson): a new one with the
    # page id it reserves, or the one recorded before (its page id, title and body stay) with this
    # source added. One statement: two checks recording it at once land on one row.
    "reserve_lesson": """
        INSERT INTO workspace_lessons (company, workspace, content_hash, page_id, title, body, sources, create_time,
                                       update_time)
        VALUES ($1, $2, $3, $4, $5, $6, jsonb_build_array($7::jsonb), $8, $8)
        ON CONFLICT (company, workspace, content_hash) DO UPDATE
           SET update_time = EXCLUDED.update_time,
               sources = CASE WHEN workspace_lessons.sources @> jsonb_build_array($7::jsonb)
                              THEN workspace_lessons.sources
                              ELSE workspace_lessons.sources || jsonb_build_array($7::jsonb) END
        RETURNING page_id, title, body""",
    # The page the knowledge kept under the title has an id of its own (it existed before the record).
    "settle_lesson": """
        UPDATE workspace_lessons SET page_id = $5, update_time = $6
         WHERE company = $1 AND workspace = $2 AND content_hash = $3 AND page_id = $4""",
}


def _outcome_text(outcome: TurnOutcome) -> str:
    """The column keeps the sessions contract's word for an outcome (``succeeded``, where the common
    enum says ``done``): the rows written before the outcome was defined once read the same."""
    return sessions_pb.TurnOutcome.Name(to_proto("sessions", outcome)).removeprefix("TURN_OUTCOME_").lower()


def _stored_outcome(text: str) -> TurnOutcome:
    return from_proto("sessions", sessions_pb.TurnOutcome.Value(f"TURN_OUTCOME_{text.upper()}"))


_READ_SESSION = RowReader(Session, {"last_seq": int, "plan_revision": int})
_READ_EVENT = RowReader(
    Event,
    {
        "kind": EventKind,
        "status": EventStatus,
        "turn_outcome": _stored_outcome,
        "remember": bool,
        "seq": int,
    },
)


def _session(row: asyncpg.Record) -> Session:
    return _READ_SESSION(row)


def _event(row: asyncpg.Record) -> Event:
    return _READ_EVENT(row)


def _steps(value: str | list[dict[str, Any]]) -> list[PlanStep]:
    items = json.loads(value) if isinstance(value, str) else value
    return [PlanStep(s["id"], s["title"], StepStatus(s["status"])) for s in items]


def _json(value: object) -> Any:
    """A jsonb column, decoded when the driver handed it over as text: the JSON boundary, so Any."""
    return json.loads(value) if isinstance(value, str) else value


_READ_CHECK = RowReader(
    LearningCheck,
    {
        "trigger": CheckTrigger,
        "plan_revision": int,
        "newly_done": lambda v: tuple(v or ()),
        "trigger_seq": int,
        "state": CheckState,
        "outcome": lambda v: CheckOutcome(v) if v else None,
        "outputs": lambda v: [
            Output(OutputKind(o["kind"]), o["id"], Disposition(o["disposition"]), tuple(o.get("evidence_ids", ())))
            for o in _json(v)
        ],
        "dropped": lambda v: [
            Dropped(OutputKind(d["kind"]), d["reason"], tuple(d.get("evidence_ids", ()))) for d in _json(v)
        ],
        "partial_failures": lambda v: [
            PartialFailure(OutputKind(p["kind"]), FailureKind(p["failure"]), p["detail"], p.get("output_id", ""))
            for p in _json(v)
        ],
        "evidence": lambda v: {k: int(n) for k, n in _json(v).items()},
    },
)


def _check(row: asyncpg.Record) -> LearningCheck:
    return _READ_CHECK(row)


class SessionTx:
    """A transaction holding one session's row lock."""

    def __init__(self, conn: asyncpg.Connection, session: Session):
        self.conn = conn
        self.session = session

    async def seen(self, event_ids: Sequence[str]) -> set[str]:
        rows = await self.conn.fetch(SQL["seen_events"], self.session.company, self.session.session_id, list(event_ids))
        return {r["event_id"] for r in rows}

    async def insert_events(self, events: Sequence[Event], now: datetime) -> list[Event]:
        """Record ``events`` after the session's last one; returns them with their sequence."""
        s = self.session
        seq = s.last_seq
        stored = []
        for e in events:
            seq += 1
            await self.conn.execute(
                SQL["insert_event"],
                s.company,
                s.session_id,
                seq,
                e.event_id,
                str(e.kind),
                e.text,
                e.event_time,
                e.turn_id,
                e.tool_name,
                e.source,
                str(e.status),
                _outcome_text(e.turn_outcome),
                e.remember,
                now,
            )
            stored.append(Event(**{**e.__dict__, "seq": seq}))
        if stored:
            await self.conn.execute(SQL["advance"], s.company, s.session_id, seq, now)
            self.session = Session(**{**s.__dict__, "last_seq": seq})
        return stored

    async def plan(self, revision: int) -> list[PlanStep] | None:
        if revision <= 0:
            return []
        value = await self.conn.fetchval(SQL["plan"], self.session.company, self.session.session_id, revision)
        return None if value is None else _steps(value)

    async def insert_plan(self, revision: int, steps: Sequence[PlanStep], now: datetime) -> None:
        s = self.session
        body = json.dumps([{"id": p.id, "title": p.title, "status": str(p.status)} for p in steps])
        await self.conn.execute(SQL["insert_plan"], s.company, s.session_id, revision, body, now)
        await self.conn.execute(SQL["set_plan_revision"], s.company, s.session_id, revision, now)
        self.session = Session(**{**s.__dict__, "plan_revision": revision})

    async def covered_seq(self) -> int:
        """The last event any check of the session was triggered at (0: none)."""
        return int(await self.conn.fetchval(SQL["covered_seq"], self.session.company, self.session.session_id))

    async def turn_window(self, turn_id: str, end: Event) -> TurnWindow:
        """The turn's work no check covered: its events after the last check's trigger point, up to
        its end; its time runs from the first of them to the end."""
        s = self.session
        covered = await self.covered_seq()
        row = await self.conn.fetchrow(SQL["turn_window"], s.company, s.session_id, turn_id, covered, end.seq)
        return TurnWindow(int(row["tool_results"] or 0), row["start_time"], end.event_time)

    async def event_id_at(self, seq: int) -> str:
        if seq <= 0:
            return ""
        value = await self.conn.fetchval(SQL["event_id_at"], self.session.company, self.session.session_id, seq)
        return value or ""

    async def active_check(self) -> LearningCheck | None:
        row = await self.conn.fetchrow(SQL["active_check"], self.session.company, self.session.session_id)
        return _check(row) if row else None

    async def insert_check(self, new: NewCheck, now: datetime) -> LearningCheck | None:
        """The receipt of a new check, queued; None when the job key was queued before."""
        s = self.session
        row = await self.conn.fetchrow(
            SQL["insert_check"],
            new.id,
            s.company,
            s.session_id,
            s.owner,
            s.workspace,
            s.seat,
            s.role,
            str(new.trigger),
            new.plan_revision,
            list(new.newly_done),
            new.turn_id,
            new.trigger_seq,
            await self.event_id_at(new.trigger_seq),
            new.job_key,
            now,
        )
        return _check(row) if row else None

    async def drop_leftover_job(self, key: str, receipt: uuid.UUID) -> None:
        """Delete the learning job of ``key`` unless a receipt other than ``receipt`` holds the key."""
        await self.conn.execute(SQL["drop_leftover_job"], self.session.company, key, receipt)


class PostgresSessionStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    # -------------------------------------------------------------- sessions

    @contextlib.asynccontextmanager
    async def open_session(
        self, company: str, session_id: str, create: Session | None, now: datetime
    ) -> AsyncIterator[SessionTx | None]:
        """A transaction holding the session's row lock; ``create`` makes it when it does not exist
        (the first append). Yields None for a session that does not exist (and is not created)."""
        async with self.pool.acquire() as conn, conn.transaction():
            if create is not None:
                await conn.execute(
                    SQL["create_session"],
                    create.company,
                    create.session_id,
                    create.owner,
                    create.workspace,
                    create.seat,
                    create.role,
                    now,
                )
            row = await conn.fetchrow(SQL["lock_session"], company, session_id)
            yield SessionTx(conn, _session(row)) if row else None

    async def get_session(self, company: str, session_id: str) -> Session | None:
        row = await self.pool.fetchrow(SQL["get_session"], company, session_id)
        return _session(row) if row else None

    async def sessions_page(
        self, where: SessionFilter, after: tuple[datetime, str] | None, limit: int
    ) -> list[SessionSummary]:
        t, i = after if after else (None, None)
        rows = await self.pool.fetch(
            SQL["sessions_page"], where.company, where.seat, where.owner, where.query, t, i, limit
        )
        return [
            SessionSummary(
                session=_session(r),
                update_time=r["update_time"],
                check_count=int(r["check_count"]),
                last_check_state=CheckState(r["last_state"]) if r["last_state"] else None,
                last_check_outcome=CheckOutcome(r["last_outcome"]) if r["last_outcome"] else None,
            )
            for r in rows
        ]

    async def plan(self, company: str, session_id: str, revision: int) -> list[PlanStep]:
        if revision <= 0:
            return []
        value = await self.pool.fetchval(SQL["plan"], company, session_id, revision)
        return [] if value is None else _steps(value)

    # -------------------------------------------------------------- evidence

    async def latest(
        self, company: str, session_id: str, kinds: Sequence[EventKind], through_seq: int, limit: int
    ) -> tuple[list[Event], int]:
        """The newest ``limit`` events of ``kinds`` at or before ``through_seq`` (oldest first), and
        how many such events there are in all."""
        names = [str(k) for k in kinds]
        rows = await self.pool.fetch(SQL["latest_of_kinds"], company, session_id, names, through_seq, limit)
        total = await self.pool.fetchval(SQL["count_of_kinds"], company, session_id, names, through_seq)
        return [_event(r) for r in rows], int(total)

    # -------------------------------------------------------------- checks

    async def get_check(self, check_id: uuid.UUID) -> LearningCheck | None:
        row = await self.pool.fetchrow(SQL["get_check"], check_id)
        return _check(row) if row else None

    async def checks_page(
        self, company: str, session_id: str, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[LearningCheck]:
        t, i = after if after else (None, None)
        rows = await self.pool.fetch(SQL["checks_page"], company, session_id, t, i, limit)
        return [_check(r) for r in rows]

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
        t, i = after if after else (None, None)
        rows = await self.pool.fetch(SQL["away_page"], company, owner, since, t, i, limit, seat)
        return [_check(r) for r in rows]

    async def away_counts(
        self, company: str, owner: str, since: datetime, *, seat: str | None = None
    ) -> dict[str, int]:
        rows = await self.pool.fetch(SQL["away_counts"], company, owner, since, seat)
        return {r["state"]: int(r["count"]) for r in rows}

    async def start_check(self, check_id: uuid.UUID, now: datetime) -> bool:
        return await self.pool.fetchval(SQL["start_check"], check_id, now) is not None

    @staticmethod
    def _receipt_json(check: LearningCheck) -> tuple[str, str, str, str]:
        return (
            json.dumps(
                [
                    {
                        "kind": str(o.kind),
                        "id": o.id,
                        "disposition": str(o.disposition),
                        "evidence_ids": list(o.evidence_ids),
                    }
                    for o in check.outputs
                ]
            ),
            json.dumps(
                [{"kind": str(d.kind), "reason": d.reason, "evidence_ids": list(d.evidence_ids)} for d in check.dropped]
            ),
            json.dumps(
                [
                    {"kind": str(p.kind), "failure": str(p.failure), "detail": p.detail, "output_id": p.output_id}
                    for p in check.partial_failures
                ]
            ),
            json.dumps(check.evidence),
        )

    async def finish_check(self, conn: asyncpg.Connection, check: LearningCheck, now: datetime) -> bool:
        """Record the check's end inside the caller's transaction (the job's finish is in it too)."""
        assert check.outcome is not None
        outputs, dropped, failures, evidence = self._receipt_json(check)
        row = await conn.fetchval(
            SQL["finish_check"],
            check.id,
            str(check.outcome.state),
            str(check.outcome),
            check.reason,
            outputs,
            dropped,
            failures,
            evidence,
            now,
        )
        return row is not None

    async def annotate_interrupted(self, check: LearningCheck) -> None:
        outputs, dropped, failures, evidence = self._receipt_json(check)
        note = f" — it went on after its claim lapsed and ended {check.outcome}: {check.reason}"[:1000]
        await self.pool.execute(SQL["annotate_interrupted"], check.id, outputs, dropped, failures, evidence, note)

    async def interrupt_check(self, company: str, job_key: str, reason: str, now: datetime) -> LearningCheck | None:
        """Report the job's check interrupted; the check as reported, or None when it was not
        queued or running (already reported)."""
        found = await self.pool.fetchval(SQL["interrupt_check"], company, job_key, reason, now)
        return None if found is None else await self.get_check(found)

    async def unfinished(self, limit: int) -> list[LearningCheck]:
        return [_check(r) for r in await self.pool.fetch(SQL["unfinished"], limit)]

    # -------------------------------------------------------------- lessons

    async def lesson_by_page(self, company: str, page_id: str) -> tuple[str, str, Any] | None:
        """(workspace, title, kept sources) of the lesson filed as the page (issue 17)."""
        row = await self.pool.fetchrow(SQL["lesson_by_page"], company, page_id)
        return (row["workspace"], row["title"], row["sources"]) if row is not None else None

    async def reserve_lesson(
        self,
        company: str,
        workspace: str,
        content_hash: str,
        new: LessonRecord,
        source: Mapping[str, object],
        now: datetime,
    ) -> LessonRecord:
        """The lesson's record with ``source`` among its sources, committed before its page is
        written: the one recorded before (its page id, title and body), else ``new``. Whatever point
        a fault then stops the write at, the record names the page (written or not) and who taught
        it, so an erasure of the person finds both, and the next check of the lesson writes the same
        page (same title, same id) rather than a second one."""
        row = await self.pool.fetchrow(
            SQL["reserve_lesson"],
            company,
            workspace,
            content_hash,
            new.page_id,
            new.title,
            new.body,
            json.dumps(source),
            now,
        )
        assert row is not None
        return LessonRecord(row["page_id"], row["title"], row["body"])

    async def settle_lesson(
        self, company: str, workspace: str, content_hash: str, reserved: str, page_id: str, now: datetime
    ) -> None:
        """The record names ``page_id`` (the page the title had before) instead of the id it
        reserved; a record erased meanwhile stays erased."""
        await self.pool.execute(SQL["settle_lesson"], company, workspace, content_hash, reserved, page_id, now)


@dataclass(frozen=True)
class LessonRecord:
    """A workspace lesson's page: its id (reserved before the page is written), title and body."""

    page_id: str
    title: str
    body: str
