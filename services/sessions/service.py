"""Session use cases: record events, save plan revisions, queue checks (the triggers), and read the
receipts and the away digest.

Dependencies arrive as arguments (store, queue, settings, clock, events), the store and the queue
as ports (``services.sessions.ports``); the servicer and the HTTP routes only translate to these
calls and back. The checks themselves run in ``worker``.

Ownership: a session belongs to the user of its first append. Every call naming a session checks
that its user is the owner before anything else is read, and answers a stranger exactly as it
answers for a session that does not exist (NOT_FOUND, SESSION_NOT_FOUND), so nothing says it
exists.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from libs.common import telemetry
from libs.common.auth import current_principal
from libs.common.bounds import at_most_chars, at_most_items
from libs.common.clock import Clock
from libs.common.config import Settings
from libs.common.errors import FailedPrecondition, InvalidFields, NotFound, field_error
from libs.common.events import EventSink
from libs.common.not_found import not_found_error
from libs.common.request_rules import at_most, time_page
from libs.common.validation import (
    decode_time_cursor,
    page_size,
    require_ident,
    require_text,
)
from services.sessions.domain import (
    CHAT_KINDS,
    DOMAIN,
    JOB_KIND,
    MAX_EVENT_TEXT_CHARS,
    MAX_EVENTS_PER_CALL,
    MAX_ID_CHARS,
    MAX_PLAN_STEPS,
    MAX_STEP_TITLE_CHARS,
    CheckTrigger,
    Event,
    EventKind,
    LearningCheck,
    NewCheck,
    PlanStep,
    Session,
    SessionFilter,
    SessionSummary,
    TurnOutcome,
    plan_trigger,
    substantial,
)
from services.sessions.ports import CheckQueue, SessionStore, SessionTx

__all__ = ["AppendResult", "PlanResult", "SessionService", "not_found"]

_log = logging.getLogger(__name__)


def not_found(session_id: str) -> NotFound:
    """The one answer for a session that does not exist and for one the caller does not own."""
    return not_found_error("session", session_id, domain=DOMAIN)


@dataclass(frozen=True)
class AppendResult:
    appended: int
    duplicates: int
    workspace: str
    queued: list[LearningCheck] = field(default_factory=list)


@dataclass(frozen=True)
class PlanResult:
    revision: int
    newly_done: tuple[str, ...]
    complete: bool
    check: LearningCheck | None
    already_saved: bool


@dataclass(frozen=True)
class Digest:
    checks: list[LearningCheck]
    next_page_token: str
    completed: int
    failed: int
    interrupted: int


def _finish_time(check: LearningCheck) -> datetime:
    """Where the away digest resumes: it lists finished checks only, so each has a finish time."""
    assert check.finish_time is not None
    return check.finish_time


# A plan past its bound, in this service's words (libs.common.bounds).
_TOO_MANY_STEPS = "a plan has at most {limit} steps, got {count}"


@dataclass(eq=False)
class SessionService:
    store: SessionStore
    queue: CheckQueue
    settings: Settings
    clock: Clock
    events: EventSink

    # ---------------------------------------------------------------- checks

    def _page_size(self, size: int) -> int:
        config = self.settings.sessions
        return page_size(size, default=config.list_default, maximum=config.list_max, domain=DOMAIN)

    def _ident(self, value: str, field: str) -> str:
        return require_ident(value, field, domain=DOMAIN)

    def _ref(self, company: str, session_id: str, user: str) -> tuple[str, str, str]:
        return self._ident(company, "company"), self._ident(session_id, "session_id"), self._ident(user, "user")

    @staticmethod
    def _reaches(session: Session | None, user: str) -> bool:
        """``user`` owns the session and the caller's credential, when bound to a seat, is bound to
        the session's: a request that leaves ``seat`` empty is not let into another seat's session
        (the edge checks only the fields a request names)."""
        if session is None or session.owner != user:
            return False
        bound = current_principal().seat
        return bound is None or bound == session.seat

    @classmethod
    def _owned(cls, tx: SessionTx | None, session_id: str, user: str) -> SessionTx:
        if tx is None or not cls._reaches(tx.session, user):
            raise not_found(session_id)
        return tx

    async def owned(self, company: str, session_id: str, user: str) -> Session:
        """The session, when ``user`` owns it and the credential reaches its seat (else NOT_FOUND,
        the same as for none)."""
        company, session_id, user = self._ref(company, session_id, user)
        session = await self.store.get_session(company, session_id)
        if session is None or not self._reaches(session, user):
            raise not_found(session_id)
        return session

    def _validate_events(self, events: Sequence[Event], found: InvalidFields) -> None:
        """Every bad event field into ``found`` (docs/integrating.md, "Errors"): a batch of events
        with two mistakes was refused for the first, fixed, and refused again for the second."""
        with found.check():
            at_most(events, MAX_EVENTS_PER_CALL, "events", domain=DOMAIN, reason="TOO_MANY_EVENTS")
        if len(events) > MAX_EVENTS_PER_CALL:
            return  # the batch as a whole is refused: its events are not read one by one
        for i, e in enumerate(events):
            where = f"events[{i}]"
            with found.check():
                require_text(e.event_id, f"{where}.event_id", domain=DOMAIN, max_chars=MAX_ID_CHARS)
            with found.check():
                at_most_chars(e.text, f"{where}.text", MAX_EVENT_TEXT_CHARS, domain=DOMAIN)
                # A message is its text: an empty one records nothing, and one marked remember would
                # hand the reviewer an empty personal fact. A tool request, result or verification may
                # be empty (a call without arguments, a command that printed nothing): its tool and
                # status are the record, and refusing it would refuse the whole batch with it.
                if e.kind in CHAT_KINDS and not e.text.strip():
                    raise field_error(
                        f"{where}.text",
                        "FIELD_REQUIRED",
                        f"{where}.text is required: a {e.kind.value.replace('_', ' ')} needs its text",
                        domain=DOMAIN,
                    )
            for name in ("turn_id", "tool_name", "source"):
                with found.check():
                    at_most_chars(getattr(e, name), f"{where}.{name}", MAX_ID_CHARS, domain=DOMAIN)
                    if name == "turn_id" and e.kind is EventKind.TURN_END:
                        require_text(e.turn_id, f"{where}.turn_id", domain=DOMAIN)
            if e.kind is EventKind.TURN_END and e.turn_outcome is TurnOutcome.UNSPECIFIED:
                found.add(
                    field_error(
                        f"{where}.turn_outcome",
                        "FIELD_REQUIRED",
                        f"{where}.turn_outcome is required on a turn end",
                        domain=DOMAIN,
                    )
                )

    # ---------------------------------------------------------------- queueing a check

    async def _queue(
        self,
        tx: SessionTx,
        trigger: CheckTrigger,
        *,
        trigger_seq: int,
        job_key: str,
        newly_done: Sequence[str] = (),
        turn_id: str = "",
    ) -> LearningCheck | None:
        """The check's receipt and its job, in the caller's transaction; None when the job key was
        queued before (a retried write)."""
        now = self.clock.now()
        check_id = uuid.uuid4()
        check = await tx.insert_check(
            NewCheck(check_id, trigger, tx.session.plan_revision, turn_id, trigger_seq, job_key, tuple(newly_done)), now
        )
        if check is None:
            return None
        if await self._enqueue(tx, job_key, check_id, now) is None:
            # The key's job is a leftover no receipt holds (this receipt just took the key): one of
            # a session erased before its jobs were deleted with it, whose id is in use again and
            # whose revisions and sequence restarted. A receipt is never left without its job (it
            # would stay queued and block Check recent work): the leftover gives way.
            _log.warning("learning job %s of company %s was a leftover: replaced", job_key, tx.session.company)
            await tx.drop_leftover_job(job_key, check_id)
            if await self._enqueue(tx, job_key, check_id, now) is None:
                raise RuntimeError(f"learning job {job_key} could not be queued for check {check_id}")
        return check

    async def _enqueue(self, tx: SessionTx, job_key: str, check_id: uuid.UUID, now: datetime) -> int | None:
        return await self.queue.enqueue(
            tx.conn,
            kind=JOB_KIND,
            key=job_key,
            company=tx.session.company,
            seat=tx.session.seat,
            payload=json.dumps({"check_id": str(check_id)}).encode(),
            trace_carrier=telemetry.inject_context(),
            now=now,
        )

    # ---------------------------------------------------------------- append

    async def append_events(
        self,
        company: str,
        session_id: str,
        user: str,
        workspace: str,
        seat: str,
        role: str,
        events: Sequence[Event],
    ) -> AppendResult:
        # Every bad field at once, in the order they were checked one by one (a single bad field
        # answers as it did then).
        invalid = InvalidFields()
        for value, name in ((company, "company"), (session_id, "session_id"), (user, "user")):
            with invalid.check():
                self._ident(value, name)
        for value, name in ((workspace, "workspace"), (seat, "seat"), (role, "role")):
            if value:
                with invalid.check():
                    self._ident(value, name)
        self._validate_events(events, invalid)
        invalid.raise_any()
        now = self.clock.now()
        existing = await self.store.get_session(company, session_id)
        create = None
        if existing is None:
            if not seat:
                raise field_error(
                    "seat",
                    "FIELD_REQUIRED",
                    "seat is required on a session's first append (the agent seat its learning goes to)",
                    domain=DOMAIN,
                )
            create = Session(
                company=company,
                session_id=session_id,
                owner=user,
                workspace=workspace or self.settings.default_workspace(company, user),
                seat=seat,
                role=role,
                last_seq=0,
                plan_revision=0,
                create_time=now,
            )
        async with self.store.open_session(company, session_id, create, now) as found:
            tx = self._owned(found, session_id, user)
            s = tx.session
            for name, given, own in (
                ("workspace", workspace, s.workspace),
                ("seat", seat, s.seat),
                ("role", role, s.role),
            ):
                if given and given != own:
                    raise FailedPrecondition(
                        f"session {session_id} has {name} {own!r}; an append cannot move it to {given!r}",
                        reason=f"SESSION_{name.upper()}_MISMATCH",
                        domain=DOMAIN,
                        field=name,
                        metadata={"session_id": session_id, name: own},
                    )
            seen = await tx.seen([e.event_id for e in events])
            fresh: list[Event] = []
            batch: set[str] = set()
            for e in events:
                if e.event_id in seen or e.event_id in batch:
                    continue
                batch.add(e.event_id)
                fresh.append(e)
            stored = await tx.insert_events(fresh, now)
            queued = []
            for e in stored:
                if e.kind is EventKind.TURN_END and e.turn_outcome is TurnOutcome.DONE:
                    check = await self._turn_end(tx, e)
                    if check is not None:
                        queued.append(check)
        for check in queued:
            await self._announce(check)
        return AppendResult(len(stored), len(events) - len(stored), s.workspace, queued)

    async def _turn_end(self, tx: SessionTx, end: Event) -> LearningCheck | None:
        """A successful turn's end: a check when the work no check covered is substantial."""
        window = await tx.turn_window(end.turn_id, end)
        rule = self.settings.sessions.substantial_turn
        if not substantial(window, rule.min_tool_results, rule.min_duration_seconds):
            return None
        return await self._queue(
            tx,
            CheckTrigger.SUBSTANTIAL_TURN,
            trigger_seq=end.seq,
            job_key=f"turn:{tx.session.session_id}:{end.seq}",
            turn_id=end.turn_id,
        )

    async def _announce(self, check: LearningCheck) -> None:
        await self.events.emit("learning_check_queued", **check.event_fields())

    # ---------------------------------------------------------------- plans

    def _validate_plan(self, revision: int, steps: Sequence[PlanStep]) -> list[PlanStep]:
        if revision <= 0:
            raise field_error(
                "revision",
                "FIELD_REQUIRED" if revision == 0 else "FIELD_INVALID",
                f"revision must be a positive number, got {revision}",
                domain=DOMAIN,
                value=revision,
            )
        at_most_items(steps, MAX_PLAN_STEPS, "steps", _TOO_MANY_STEPS, domain=DOMAIN, reason="TOO_MANY_STEPS")
        ids: set[str] = set()
        out = []
        for i, step in enumerate(steps):
            where = f"steps[{i}]"
            require_text(step.id, f"{where}.id", domain=DOMAIN, max_chars=MAX_ID_CHARS)
            require_text(step.title, f"{where}.title", domain=DOMAIN, max_chars=MAX_STEP_TITLE_CHARS)
            if step.id in ids:
                raise field_error(
                    f"{where}.id",
                    "DUPLICATE_STEP_ID",
                    f"{where}.id {step.id!r} repeats an earlier step's id",
                    domain=DOMAIN,
                    step_id=step.id,
                )
            ids.add(step.id)
            out.append(step)
        return out

    async def save_plan(
        self, company: str, session_id: str, user: str, revision: int, steps: Sequence[PlanStep]
    ) -> PlanResult:
        company, session_id, user = self._ref(company, session_id, user)
        clean = self._validate_plan(revision, steps)
        now = self.clock.now()
        async with self.store.open_session(company, session_id, None, now) as found:
            tx = self._owned(found, session_id, user)
            latest = tx.session.plan_revision
            if revision <= latest:
                if revision == latest and await tx.plan(latest) == clean:
                    return PlanResult(revision, (), False, None, already_saved=True)
                # A stale write is refused and triggers nothing.
                raise FailedPrecondition.of_field(
                    "revision",
                    "STALE_PLAN_REVISION",
                    f"revision {revision} is stale: session {session_id} is at plan revision {latest}",
                    domain=DOMAIN,
                    revision=revision,
                    current_revision=latest,
                )
            previous = await tx.plan(latest) or []
            await tx.insert_plan(revision, clean, now)
            rule = plan_trigger(previous, clean)
            check = None
            if rule.trigger is not None:
                check = await self._queue(
                    tx,
                    rule.trigger,
                    trigger_seq=tx.session.last_seq,
                    job_key=f"plan:{session_id}:{revision}",
                    newly_done=rule.newly_done,
                )
        if check is not None:
            await self._announce(check)
        return PlanResult(revision, rule.newly_done, rule.complete, check, already_saved=False)

    # ---------------------------------------------------------------- manual

    async def check_recent_work(self, company: str, session_id: str, user: str) -> tuple[LearningCheck, bool]:
        """A manual check, or the session's queued or running one (never a pile of requests)."""
        company, session_id, user = self._ref(company, session_id, user)
        now = self.clock.now()
        async with self.store.open_session(company, session_id, None, now) as found:
            tx = self._owned(found, session_id, user)
            active = await tx.active_check()
            if active is not None:
                return active, True
            check = await self._queue(
                tx,
                CheckTrigger.MANUAL,
                trigger_seq=tx.session.last_seq,
                job_key=f"manual:{session_id}:{uuid.uuid4()}",
            )
            assert check is not None  # a fresh key is never taken
        await self._announce(check)
        return check, False

    # ---------------------------------------------------------------- reads

    async def list_checks(
        self, company: str, session_id: str, user: str, size: int, token: str
    ) -> tuple[list[LearningCheck], str]:
        session = await self.owned(company, session_id, user)
        size = self._page_size(size)
        scope = {"company": session.company, "session": session.session_id}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        checks = await self.store.checks_page(session.company, session.session_id, after, size + 1)
        return time_page(checks, size, scope, lambda c: c.create_time, lambda c: c.id)

    async def list_sessions(
        self, company: str, seat: str, user: str, query: str, size: int, token: str
    ) -> tuple[list[SessionSummary], str]:
        """A company's sessions, most recently active first. A credential bound to a seat or a user
        lists only that seat's or user's sessions: naming none is naming its own (the edge has
        refused any other)."""
        company = self._ident(company, "company")
        principal = current_principal()
        seat_or_none = self._ident(seat, "seat") if seat else principal.seat or None
        owner = self._ident(user, "user") if user else principal.user or None
        size = self._page_size(size)
        scope = {"company": company, "seat": seat_or_none, "user": owner, "query": query}
        after = decode_time_cursor(token, scope, domain=DOMAIN)
        rows = await self.store.sessions_page(SessionFilter(company, seat_or_none, owner, query), after, size + 1)
        return time_page(rows, size, scope, lambda s: s.update_time, lambda s: s.session.session_id)

    async def away_digest(self, company: str, user: str, since: datetime | None, size: int, token: str) -> Digest:
        company = self._ident(company, "company")
        user = self._ident(user, "user")
        if since is None:
            raise field_error("since_time", "FIELD_REQUIRED", "since_time is required", domain=DOMAIN)
        size = self._page_size(size)
        # A credential bound to a seat hears only of that seat's checks (the request names no seat).
        seat = current_principal().seat or None
        scope = {"company": company, "user": user, "seat": seat, "since": since.isoformat()}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        rows = await self.store.away_page(company, user, since, after, size + 1, seat=seat)
        checks, next_token = time_page(rows, size, scope, _finish_time, lambda c: c.id)
        counts = await self.store.away_counts(company, user, since, seat=seat)
        return Digest(
            checks,
            next_token,
            counts.get("completed", 0),
            counts.get("failed", 0),
            counts.get("interrupted", 0),
        )
