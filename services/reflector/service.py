"""Reflector use cases: queue a finished turn durably, read the records."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common import telemetry
from libs.common.clock import Clock
from libs.common.errors import InvalidFields, field_error
from libs.common.events import EventSink, bookkeeping
from libs.common.not_found import require_found
from libs.common.validation import (
    decode_time_cursor,
    encode_time_cursor,
    page_size,
    require_ident,
    require_text,
    seat_ref,
)
from services.reflector.domain import (
    DOMAIN,
    JOB_KIND,
    ROUND_SUFFIX,
    ReflectionState,
    job_key,
    reflection_id,
    turn_fields,
)
from services.reflector.ports import ReflectionStore
from services.reflector.store import PostgresReflectionStore, ReflectionRecord

if TYPE_CHECKING:  # only for the annotation: the harness module loads its workers
    from services.reflector.harness import Harness

__all__ = ["ReflectorService"]

_WORK_ITEM = re.compile(r"^(native|jira):\S+$")


MAX_ASKED_CHARS = 100_000
"""What a turn was asked, in all: the episode's ``ask`` takes at most this (RecordEpisode's contract)."""


def _asked_length(turn: pb.TurnCompleted) -> int:
    """The length of the ask the episode will be given (``domain.Turn.asked``), without building it."""
    if not turn.interactions:
        return len(turn.ask)
    bodies = [len(i.body) for i in turn.interactions if i.body]
    return sum(bodies) + max(len(bodies) - 1, 0)


def _check_turn(turn: pb.TurnCompleted) -> None:
    """Refuse a turn no reflection can be made of, naming every bad field at once (one
    INVALID_ARGUMENT, :class:`~libs.common.errors.InvalidFields`): an engine fixing a refused turn
    hears of all its mistakes in one round trip, as the contract's own refusals tell it."""
    found = InvalidFields()
    with found.check():
        require_ident(turn.company, "company", domain=DOMAIN)
    with found.check():
        require_ident(turn.seat, "seat", domain=DOMAIN)
    with found.check():
        require_text(turn.turn_id, "turn.turn_id", domain=DOMAIN, max_chars=200)
        if turn.turn_id.endswith(ROUND_SUFFIX):
            raise field_error(
                "turn.turn_id",
                "FIELD_INVALID",
                f"turn.turn_id must not end in {ROUND_SUFFIX!r}: that names a run's self_iterate round",
                domain=DOMAIN,
                value=turn.turn_id,
            )
    # The role files the turn's episode (RecordEpisode takes an identifier) and names a configured
    # role (config refuses a name with a space): one rule, held here, so a role no service can file
    # under is refused naming the field rather than accepted and never given an episode.
    with found.check():
        require_ident(turn.role, "turn.role", domain=DOMAIN)
    if turn.outcome == pb.TURN_OUTCOME_UNSPECIFIED or turn.outcome not in pb.TurnOutcome.values():
        found.add(
            field_error(
                "turn.outcome",
                "FIELD_REQUIRED",
                "turn.outcome must be DONE, FAILED, SELF_ITERATE or SKIPPED",
                domain=DOMAIN,
            )
        )
    # The turn's episode needs both times (spec: every episode row carries started_at, ended_at and
    # duration_ms): a turn without them is refused here, naming the field, rather than accepted
    # and then silently left without an episode.
    for name in ("start_time", "end_time"):
        if not turn.HasField(name):
            found.add(
                field_error(
                    f"turn.{name}",
                    "FIELD_REQUIRED",
                    f"turn.{name} is required: the turn's episode records when it started and ended",
                    domain=DOMAIN,
                )
            )
    if turn.HasField("start_time") and turn.HasField("end_time"):
        if turn.end_time.ToDatetime() < turn.start_time.ToDatetime():
            found.add(
                field_error("turn.end_time", "FIELD_INVALID", "turn.end_time is before turn.start_time", domain=DOMAIN)
            )
    for i, item in enumerate(turn.interactions):
        if not item.sender.platform or not (item.sender.handle or item.sender.external_id):
            found.add(
                field_error(
                    f"turn.interactions[{i}].sender",
                    "FIELD_REQUIRED",
                    "an interaction's sender needs a platform and a handle or an external id",
                    domain=DOMAIN,
                )
            )
    if turn.work_item and not _WORK_ITEM.match(turn.work_item):
        found.add(
            field_error(
                "turn.work_item",
                "FIELD_INVALID",
                f"turn.work_item {turn.work_item!r} is not a backend-qualified ref (native:<id> or jira:<id>)",
                domain=DOMAIN,
                value=turn.work_item[:200],
            )
        )
    for i, skill in enumerate(turn.offered_skills):
        with found.check():
            require_text(skill.id, f"turn.offered_skills[{i}].id", domain=DOMAIN)
    # What the turn was asked becomes its episode's ask: refused here, at the edge, rather than
    # accepted and then lost when the episode cannot take it. The contract bounds each body; only
    # their sum needs this. Counted as ``Turn.asked`` builds it (the non-empty bodies joined one to
    # a line, so one separator fewer than bodies): a separator counted per body refused a single
    # body of exactly the documented limit.
    asked = _asked_length(turn)
    if asked > MAX_ASKED_CHARS:
        found.add(
            field_error(
                "turn.interactions" if turn.interactions else "turn.ask",
                "FIELD_TOO_LONG",
                f"the turn's inbound text is {asked} characters in all; the limit is {MAX_ASKED_CHARS}",
                domain=DOMAIN,
                limit=MAX_ASKED_CHARS,
                length=asked,
            )
        )
    found.raise_any()


S = TypeVar("S", bound=ReflectionStore, default=PostgresReflectionStore)
"""The store: the servicer's erasure calls reach the Postgres one's pool; the use cases only the port."""


@dataclass(eq=False)
class ReflectorService(Generic[S]):
    store: S
    clock: Clock
    events: EventSink
    harness: Harness | None = None
    """The worker harness of this process (``drain()`` reflects what is queued now)."""

    async def submit(self, turn: pb.TurnCompleted) -> tuple[bool, str]:
        """Queue the turn durably; returns (queued by this call, current state). A run id is the
        seat's own: another seat reporting the same run id queues its own reflection."""
        _check_turn(turn)
        now: datetime = self.clock.now()
        completed: dict[str, Any] = {
            **turn_fields(turn),
            "role": turn.role,
            "outcome": pb.TurnOutcome.Name(turn.outcome),
            "label": turn.label,
            "tool_calls": len(turn.tools_called),
            "interactions": len(turn.interactions),
        }
        # ``turn_completed`` announces the queueing: the Postgres store writes it in the statement
        # that queues the turn, only if that statement queued it (no statement of its own). A store
        # that did not carry it leaves it to be emitted here, as before.
        # A self_iterate round is reflected apart from its run's settled report (domain.reflection_id).
        rid = reflection_id(turn.turn_id, turn.outcome == pb.TURN_OUTCOME_SELF_ITERATE)
        with bookkeeping() as batch:
            batch.announce("turn_completed", now, **completed)
            try:
                queued = await self.store.queue_turn(
                    rid,
                    kind=JOB_KIND,
                    key=job_key(turn.seat, rid),
                    company=turn.company,
                    seat=turn.seat,
                    payload=turn.SerializeToString(),
                    trace_carrier=telemetry.inject_context(),
                    now=now,
                )
            finally:
                unwritten = batch.withdraw()
        if queued:
            if unwritten:
                await self.events.emit("turn_completed", **completed)
            return True, ReflectionState.QUEUED  # this call queued it: no need to read it back
        record = await self._record(turn.company, turn.seat, rid)
        return False, record.state if record else ReflectionState.QUEUED

    async def _record(self, company: str, seat: str, rid: str) -> ReflectionRecord | None:
        """The reflection ``rid``'s record; for one an erasure removed (its job row kept, emptied:
        the duplicate gate), an ERASED one naming only the turn — not a missing record, which
        SubmitTurn read as still queued while nothing was queued or would run."""
        record = await self.store.get(company, seat, rid)
        if record is None and await self.store.erased(company, seat, rid):
            return ReflectionRecord(company, seat, rid, ReflectionState.ERASED, gate=None)
        return record

    async def get(self, company: str, seat: str, turn_id: str) -> ReflectionRecord:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        require_text(turn_id, "turn_id", domain=DOMAIN)
        record = await self._record(company, seat, turn_id)
        if record is None and not turn_id.endswith(ROUND_SUFFIX):
            # A run that has only self-iterated so far: its round's reflection answers for it.
            record = await self._record(company, seat, turn_id + ROUND_SUFFIX)
        message = f"no reflection of turn {turn_id} for seat {seat}"
        return require_found(record, "reflection", turn_id, seat=seat, id_key="turn_id", message=message, domain=DOMAIN)

    async def list(self, company: str, seat: str, size: int, token: str) -> tuple[list[ReflectionRecord], str, int]:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        size = page_size(size, default=20, maximum=200, domain=DOMAIN)
        scope = {"company": company, "seat": seat}
        after = decode_time_cursor(token, scope, domain=DOMAIN)
        records = await self.store.page(company, seat, after, size + 1)
        total = await self.store.count(company, seat)
        next_token = ""
        if len(records) > size:
            records = records[:size]
            last = records[-1]
            assert last.submit_time is not None  # every reflection row is inserted with its submit_time
            next_token = encode_time_cursor(last.submit_time, last.turn_id, scope)
        return records, next_token, total
