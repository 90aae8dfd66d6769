"""The privacy service's use cases: queue an erasure (a person, a seat, a company), run it across
the owners, read its receipt and the audit.

An erasure runs as a job of kind ``erasure`` in the shared durable queue. Running it is resumable
at every step, because each step's outcome is recorded before the next starts:

1. collect (a person only): the owners that know which run ids and sessions carried the person,
   or which other identifiers are theirs, report them; the target with them is recorded;
2. erase: each owner, in ``ERASE_ORDER``, erases its own rows in its own transaction and records
   its report under the erasure id (a repeat returns that report); the coordinator records it too;
3. verify: every owner is asked what it still holds of the target, in its tables and in its vector
   index; nothing, and no vector point left behind, is a SUCCEEDED erasure. Rows found that were
   written after the erase step (a reflection of the person that was running) start another
   round of 2. under a round id (``MAX_ROUNDS`` in all); what the last round still finds is FAILED,
   with the residues named; an index check that could not run keeps it unverified (retried);
4. finish: the state and residues are recorded, and the target (the person's identifiers, names,
   run ids) is dropped from the audit row in the same statement.

A SIGKILL anywhere leaves the job claimed until its lease lapses; the next claim resumes at the
first step not recorded, and every owner returns the report it recorded, so the receipt is the same.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from libs.common import auth
from libs.common.clock import Clock
from libs.common.config import PrivacyConfig
from libs.common.erasure import INDEX_PREFIX, PENDING_CHECK, Kind, Report, Target, round_id
from libs.common.errors import PermissionDenied, field_error, request_id_reused
from libs.common.events import EventSink
from libs.common.not_found import require_found
from libs.common.validation import decode_time_cursor, encode_time_cursor, page_size
from services.privacy.domain import (
    COLLECTORS,
    DOMAIN,
    ERASE_ORDER,
    JOB_KIND,
    MAX_ROUNDS,
    Erasure,
    ErasureState,
    Holder,
    report_key,
    request_digest,
    same_request,
    subject_digest,
)
from services.privacy.ports import ErasureQueue, ErasureStore, Owners

__all__ = [
    "Owners",
    "PrivacyService",
    "emit_erasure_event",
    "readable_seat",
    "requested_by",
    "require_seat_credential",
]

_log = logging.getLogger(__name__)


async def emit_erasure_event(events: EventSink, kind: str, erasure: Erasure, **payload: Any) -> None:
    """An event of ``erasure`` (its id and kind, and ``payload``), under its company and no seat:
    the audit is the erasures table, and an event of an erased seat is not kept."""
    await events.emit(
        kind, company=erasure.company, seat=None, erasure_id=str(erasure.id), erasure_kind=str(erasure.kind), **payload
    )


def requested_by() -> str:
    """Who asked, for the audit: the token's public id and bound user, or the calling service."""
    p = auth.current_principal()
    if p.kind == "token":
        return f"token:{p.token_id}" + (f" user:{p.user}" if p.user else "")
    if p.kind == "service":
        return f"service:{p.service}"
    return p.kind


def readable_seat(what: str) -> str | None:
    """The seat whose erasures the caller may read: None for every one (a credential bound to the
    company alone, a service, local mode), a seat-bound credential's own seat. A credential bound
    to a user alone has no seat to narrow to and is refused: the audit is the company's, not one
    user's. ``what`` names the read."""
    principal = auth.current_principal()
    if principal.seat is not None:
        return principal.seat
    principal.require_company_wide(what)
    return None


def require_seat_credential(what: str) -> None:
    """Refuse a seat's erasure or export (``what`` names it) to a token bound to a user alone.

    The edge refuses a seat-bound token naming another seat, but compares a seat only when the token
    has one: a token bound to a user alone would reach every seat of the company, erasing or reading
    out seats whose notes and profiles are other people's. Such a token has no seat of its own, so
    it is refused as a company-wide call is; a seat-bound token (its seat, checked at the edge), the
    company's, a service and local mode are served."""
    principal = auth.current_principal()
    if principal.trusted or principal.seat is not None or principal.user is None:
        return
    raise PermissionDenied(
        f"the credential is bound to user {principal.user}: {what} needs a credential bound to that seat"
        " or to the company alone",
        reason="COMPANY_WIDE_CREDENTIAL_REQUIRED",
        field="seat",
        metadata={"bound_user": principal.user},
    )


def _widened(target: Target, found: Iterable[Report]) -> Target:
    """The target with what the owners found of the person: their run ids, their sessions, and
    their other identifiers (aliases: a handle the request did not name beside the external id it
    did). One hop: an alias's own pairs are not followed (a handle and an external id per platform
    are the pairs the owners keep)."""
    turns, sessions, aliases = set(target.turn_ids), set(target.session_ids), set(target.aliases)
    for report in found:
        turns |= report.turn_ids
        sessions |= report.session_ids
        aliases |= report.aliases
    aliases -= {target.handle, target.external_id, ""}
    return dataclasses.replace(
        target,
        turn_ids=tuple(sorted(turns)),
        session_ids=tuple(sorted(sessions)),
        aliases=tuple(sorted(aliases)),
    )


def _retried(known: Erasure, target: Target, request_id: str) -> Erasure:
    """The erasure ``request_id`` queued, when ``target`` repeats its request; otherwise refused.
    The refusal names no erasure: the caller learns only that the key is taken (within the scope
    it asked in) and picks another."""
    if same_request(known, target):
        return known
    # Only a person's request can differ within its scope (a seat's or the company's has nothing
    # beside its kind and seat, which the scope already fixes).
    raise request_id_reused(
        request_id,
        f"request_id {request_id!r} already queued the erasure of another person, or of this one with other"
        " names: a retry repeats its request exactly, a new request needs a new request_id",
        domain=DOMAIN,
    )


def _rows_left(report: Report) -> bool:
    """The owner still holds rows of the target (not counting what its index checks found)."""
    return any(
        t.count or t.changed for name, t in report.tables.items() if not name.startswith((INDEX_PREFIX, PENDING_CHECK))
    )


@dataclass
class PrivacyService:
    """The erasure use cases on their ports (a dataclass: its parts are its fields)."""

    store: ErasureStore
    queue: ErasureQueue
    owners: Owners
    clock: Clock
    events: EventSink
    config: PrivacyConfig

    # ------------------------------------------------------------------ requests

    async def request(self, target: Target, request_id: str | None) -> Erasure:
        """Queue an erasure (once per ``request_id``); the erasure, as it stands. A person's or the
        company's erasure reaches every seat and user: it needs a credential bound to the company
        alone; a seat's, one bound to that seat (the edge refused another seat) or to the company.

        A key is scoped to what the erasure is of, its kind and its seat: one ticket may name a
        person and a seat, and a seat-bound caller's key finds only its own seat's erasures (it can
        read them all), never another seat's. Within that scope a retry must be the same request
        (``domain.request_digest``); a key reused for another person or other names is refused,
        since answering with the earlier erasure handed out a receipt for an erasure never run."""
        if target.kind is Kind.SEAT:
            require_seat_credential("erasing a seat")
        else:
            what = "erasing the company" if target.kind is Kind.COMPANY else "erasing a person across the company"
            auth.current_principal().require_company_wide(what)
        if target.kind is Kind.SUBJECT and not target.identifiers:
            raise field_error("subject", "SUBJECT_REQUIRED", "name the person's handle or external id", domain=DOMAIN)
        if request_id:
            known = await self.store.by_request(target.company, target.kind, target.seat, request_id)
            if known is not None:
                return _retried(known, target, request_id)
        now = self.clock.now()
        erasure = Erasure(
            id=target.erasure_id,
            company=target.company,
            kind=target.kind,
            seat=target.seat,
            subject_digest=subject_digest(target),
            requested_by=requested_by(),
            state=ErasureState.QUEUED,
            create_time=now,
            request_digest=request_digest(target),
        )
        async with self.store.transaction() as conn:
            created = await self.store.insert(conn, erasure, target, request_id or None)
            if created is not None:
                await self.queue.enqueue(
                    conn,
                    kind=JOB_KIND,
                    key=str(erasure.id),
                    company=erasure.company,
                    seat=erasure.seat,
                    payload=json.dumps({"erasure_id": str(erasure.id)}).encode(),
                    trace_carrier={},
                    now=now,
                )
        if created is None:  # a concurrent call with the same request id won
            assert request_id
            known = await self.store.by_request(target.company, target.kind, target.seat, request_id)
            assert known is not None
            return _retried(known, target, request_id)
        await emit_erasure_event(self.events, "erasure_requested", erasure, requested_by=erasure.requested_by)
        return erasure

    async def get(self, company: str, erasure_id: str) -> Erasure:
        """The erasure (GetErasure): a seat-bound credential finds only its own seat's."""
        return await self._get(company, erasure_id, readable_seat("reading the company's erasures"))

    async def _get(self, company: str, erasure_id: str, seat: str | None) -> Erasure:
        try:
            eid = uuid.UUID(erasure_id)
        except ValueError:
            raise field_error(
                "erasure_id", "FIELD_INVALID", f"erasure_id {erasure_id!r} is not a UUID", domain=DOMAIN
            ) from None
        # No seat named: an erasure is the company's, and the message names no owner. Of another
        # seat than ``seat``: the same answer as for none.
        found = await self.store.get(eid, company)
        if found is not None and seat is not None and found.seat != seat:
            found = None
        return require_found(found, "erasure", erasure_id, domain=DOMAIN)

    async def list(self, company: str, size: int, token: str) -> tuple[list[Erasure], str]:
        """The company's erasures, newest first; a seat-bound credential's: its seat's only."""
        seat = readable_seat("listing the company's erasures")
        size = page_size(size, default=50, maximum=200, domain=DOMAIN)
        scope = {"company": company, "seat": seat, "list": "erasures"}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        rows = await self.store.page(company, after, size + 1, seat=seat)
        token_out = ""
        if len(rows) > size:
            rows = rows[:size]
            token_out = encode_time_cursor(rows[-1].create_time, rows[-1].id, scope)
        return rows, token_out

    # ------------------------------------------------------------------ running one

    async def run(self, erasure: Erasure, holder: Holder) -> Erasure:
        """Carry the erasure to its end from wherever it stopped (see the module docstring).
        An owner's failure propagates (the worker retries the job later). Every write is fenced by
        ``holder``'s claim: ``ClaimLost`` when another holder took the erasure."""
        if erasure.state.finished or erasure.target is None:
            return erasure
        await self.store.mark_running(erasure.id)
        target = erasure.target
        if target.kind is Kind.SUBJECT and not erasure.collected:
            found = [await self.owners.find(owner, target) for owner in COLLECTORS]
            target = _widened(target, found)
            await self.store.set_collected(holder, erasure.id, target)
        while True:
            target = await self._erase_round(erasure, target, holder)
            verification = await self._verify(target)
            residues = {o: r for o, r in verification.items() if _rows_left(r)}
            if not residues or erasure.round >= MAX_ROUNDS:
                break  # nothing left in the tables (index checks are retried, never re-erased)
            # Rows written after the erase step (a reflection of the person's turn that was running,
            # a turn submitted meanwhile): another round, with the run ids they name.
            target = _widened(target, residues.values())
            erasure.round += 1
            _log.info("erasure %s found %s after its erase step; round %d", erasure.id, sorted(residues), erasure.round)
            await self.store.next_round(holder, erasure.id, target, erasure.round)
        pending = sum(r.index_points_pending for r in erasure.reports.values())
        in_index = sum(
            t.count for r in verification.values() for name, t in r.tables.items() if name.startswith(INDEX_PREFIX)
        )
        checks = sorted(
            {
                name[len(PENDING_CHECK) :]
                for r in verification.values()
                for name in r.tables
                if name.startswith(PENDING_CHECK)
            }
        )
        verified = not residues and not pending and not in_index and not checks
        reason = ""
        if residues:
            reason = "the verification still found rows: " + ", ".join(
                f"{o} {r.total}" for o, r in sorted(residues.items())
            )
        elif pending or in_index:
            reason = (
                f"{pending + in_index} vector points of erased rows are still in the index (it was down); the"
                " orphan sweep and a re-verification remove them"
            )
        elif checks:
            reason = "verification pending: " + ", ".join(checks) + " could not be searched (the index was down)"
        erasure.pending_checks = checks
        await self.store.set_pending_checks(holder, erasure.id, checks)
        erasure.state = ErasureState.SUCCEEDED if verified else ErasureState.FAILED
        erasure.residues, erasure.verified, erasure.reason = residues, verified, reason
        return erasure

    async def _erase_round(self, erasure: Erasure, target: Target, holder: Holder) -> Target:
        """Ask every owner (in ``ERASE_ORDER``) to erase, under the round's id; the target as the
        knowledge owner was asked (with the pages the sessions owner named)."""
        asked = dataclasses.replace(target, erasure_id=round_id(erasure.id, erasure.round))
        for owner in ERASE_ORDER:
            key = report_key(owner, erasure.round)
            done = erasure.reports.get(key)
            if done is not None and not done.index_points_pending:
                continue
            # Not asked yet, or its points could not all leave the index: asked (again). A repeat
            # returns the owner's recorded report and drops the points once more.
            if owner == "knowledge":
                pages = set(asked.page_ids)
                for report in erasure.reports.values():
                    pages |= report.page_ids
                asked = dataclasses.replace(asked, page_ids=tuple(sorted(pages)))
            report = await self.owners.erase(owner, asked)
            await self.store.put_report(holder, erasure.id, key, report)
            erasure.reports[key] = report
        return dataclasses.replace(asked, erasure_id=erasure.id)

    async def _verify(self, target: Target) -> dict[str, Report]:
        """What every owner still holds of the target (rows, and the checks of its vector index
        that found points or could not run), by owner; empty when nothing."""
        found: dict[str, Report] = {}
        for owner in ERASE_ORDER:
            report = await self.owners.find(owner, target)
            if report.tables:
                found[owner] = report
        return found

    def counts(self, erasure: Erasure) -> dict[str, int]:
        """Rows erased or changed per owner (the audit's counts)."""
        return {owner: r.total for owner, r in sorted(erasure.receipt().items())}
