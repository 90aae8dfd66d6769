"""The erasure store port's promises on the in-memory fake (tests/unit/fakes/privacy.py), as the
erasure job relies on them: a request id names one erasure; RUNNING only from QUEUED; a round only
goes forward; a report replaces the one of its key; finishing drops the person's target in the same
write; a transaction that raises leaves nothing. tests/test_privacy_store_port.py runs the same
checks on the Postgres store."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.common.erasure import Kind, Report, Target
from services.privacy.domain import ClaimLost, Erasure, ErasureState, Holder
from services.privacy.ports import ErasureStore
from tests.unit.fakes.privacy import FakeErasureDb

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _erasure(at: datetime = T0, kind: Kind = Kind.SUBJECT, seat: str = "") -> tuple[Erasure, Target]:
    target = Target(
        uuid.uuid4(), "acme", kind, seat=seat, handle="bob" if kind is Kind.SUBJECT else "", platform="slack"
    )
    erasure = Erasure(target.erasure_id, "acme", kind, seat, "digest", "local", ErasureState.QUEUED, at)
    erasure.request_digest = f"request {kind} {seat}"
    return erasure, target


async def _insert(
    store: ErasureStore, request_id: str | None = None, at: datetime = T0, kind: Kind = Kind.SUBJECT, seat: str = ""
) -> uuid.UUID | None:
    erasure, target = _erasure(at, kind, seat)
    async with store.transaction() as tx:
        return await store.insert(tx, erasure, target, request_id)


def _queue(store: ErasureStore) -> Any:
    """The job queue beside ``store``: the real one on its pool, or the fake's."""
    pool = getattr(store, "pool", None)
    if pool is not None:
        from libs.common.jobs import JobQueue

        return JobQueue(pool)
    return store._db.queue  # type: ignore[attr-defined]


async def _claim(store: ErasureStore, eid: uuid.UUID, worker: str = "holder-a", at: datetime = T0) -> Holder:
    """The erasure's job queued and claimed by ``worker`` (a kind of its own: no other check's job
    is taken); its claim as the run holds it."""
    queue, kind = _queue(store), f"erasure-check-{eid}"
    async with store.transaction() as tx:
        job = dict(kind=kind, key=str(eid), company="acme", seat="", payload=b"{}", trace_carrier={}, now=at)
        await queue.enqueue(tx, **job)
    claimed = await queue.claim(kind, worker, at, 60)
    assert claimed is not None
    return Holder(claimed.id, worker, claimed.attempts)


async def check_a_request_id_names_one_erasure(store: ErasureStore) -> None:
    first = await _insert(store, "req-1")
    assert first is not None and await _insert(store, "req-1") is None
    found = await store.by_request("acme", Kind.SUBJECT, "", "req-1")
    assert found is not None and found.id == first and found.request_digest == "request subject "
    assert await store.by_request("globex", Kind.SUBJECT, "", "req-1") is None
    assert await _insert(store) is not None and await _insert(store) is not None  # no request id: each is new
    row = await store.get(first, "acme")
    assert row is not None and row.state is ErasureState.QUEUED and row.target is not None
    assert row.target.handle == "bob" and await store.get(first, "globex") is None


async def check_a_request_id_is_scoped_to_the_kind_and_seat(store: ErasureStore) -> None:
    """One ticket's key names a person's erasure, each seat's and the company's: a seat's keys are
    its own, so a seat-bound caller's key never finds another seat's erasure."""
    ids = {
        (kind, seat): await _insert(store, "ticket-1", kind=kind, seat=seat)
        for kind, seat in ((Kind.SUBJECT, ""), (Kind.SEAT, "ana"), (Kind.SEAT, "bob"), (Kind.COMPANY, ""))
    }
    assert None not in ids.values() and len(set(ids.values())) == 4
    for (kind, seat), eid in ids.items():
        found = await store.by_request("acme", kind, seat, "ticket-1")
        assert found is not None and found.id == eid and (found.kind, found.seat) == (kind, seat)
        assert await _insert(store, "ticket-1", kind=kind, seat=seat) is None
    assert await store.by_request("acme", Kind.SEAT, "carol", "ticket-1") is None


async def check_the_steps_are_recorded_as_they_say(store: ErasureStore) -> None:
    eid = await _insert(store)
    assert eid is not None
    holder = await _claim(store, eid)
    await store.mark_running(eid)
    row = await store.get(eid)
    assert row is not None and row.state is ErasureState.RUNNING and not row.collected
    assert row.target is not None
    collected = Target(eid, "acme", Kind.SUBJECT, handle="bob", platform="slack", turn_ids=("r1",))
    await store.set_collected(holder, eid, collected)
    await store.next_round(holder, eid, collected, 2)
    await store.next_round(holder, eid, Target(eid, "acme", Kind.SUBJECT, handle="x"), 2)  # not forward: kept
    report = Report("diary")
    report.add("agent_diary", ["n1"])
    await store.put_report(holder, eid, "diary", report)
    report.add("agent_diary", ["n2"])
    await store.put_report(holder, eid, "diary", report)  # a repeat replaces
    await store.set_pending_checks(holder, eid, ["episodes"])
    row = await store.get(eid)
    assert row is not None and row.collected and row.round == 2
    assert row.target is not None and (row.target.handle, row.target.turn_ids) == ("bob", ("r1",))
    assert row.reports["diary"].total == 2 and row.pending_checks == ["episodes"]
    residue = Report("profiles")
    residue.add("profiles", ["p1"])
    async with store.transaction() as tx:
        await store.set_reason(tx, eid, "still there")
        ended = dataclasses.replace(
            row, state=ErasureState.FAILED, residues={"profiles": residue}, verified=False, reason="found rows"
        )
        await store.finish(tx, ended, T0)
    row = await store.get(eid)
    assert row is not None and (row.state, row.verified, row.reason, row.finish_time) == (
        ErasureState.FAILED,
        False,
        "found rows",
        T0,
    )
    assert row.target is None and row.residues["profiles"].total == 1  # the person left the audit
    await store.mark_running(eid)  # finished: stays
    assert (await store.get(eid)).state is ErasureState.FAILED  # type: ignore[union-attr]


async def check_a_run_writes_only_while_its_claim_is_held(store: ErasureStore) -> None:
    """A holder whose lease lapsed, its erasure taken again and finished by another: none of its
    writes lands (it used to write the person's identifiers back into the SUCCEEDED audit row)."""
    eid = await _insert(store)
    assert eid is not None
    stale = await _claim(store, eid, "holder-a")
    queue = _queue(store)
    later = T0 + timedelta(minutes=5)  # past the stale claim's lease: taken again
    again = await queue.claim(f"erasure-check-{eid}", "holder-b", later, 60)
    assert again is not None
    holder = Holder(again.id, "holder-b", again.attempts)
    await store.mark_running(eid)
    target = Target(eid, "acme", Kind.SUBJECT, handle="bob", platform="slack", turn_ids=("r1",))
    with pytest.raises(ClaimLost):
        await store.set_collected(stale, eid, target)
    await store.set_collected(holder, eid, target)  # the holder writes
    row = await store.get(eid)
    assert row is not None
    async with store.transaction() as tx:
        assert await queue.finish(tx, again, "holder-b", later)
        await store.finish(tx, dataclasses.replace(row, state=ErasureState.SUCCEEDED, verified=True), later)
    report = Report("diary")
    report.add("agent_diary", ["n1"])
    writes = [
        store.set_collected(stale, eid, target),
        store.next_round(stale, eid, target, 2),
        store.set_pending_checks(stale, eid, ["episodes"]),
        store.put_report(stale, eid, "late", report),
        store.set_collected(holder, eid, target),  # its own claim, finished: no more writes either
    ]
    for write in writes:
        with pytest.raises(ClaimLost):
            await write
    row = await store.get(eid)
    assert row is not None and row.state is ErasureState.SUCCEEDED and row.target is None
    assert row.round <= 1 and "late" not in row.reports and row.pending_checks == []


async def check_a_transaction_that_raises_leaves_nothing(store: ErasureStore) -> None:
    erasure, target = _erasure()
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await store.insert(tx, erasure, target, "req-9")
            raise RuntimeError("the enqueue beside it failed")
    assert await store.get(erasure.id) is None and await store.by_request("acme", Kind.SUBJECT, "", "req-9") is None


async def check_the_audit_pages_newest_first(store: ErasureStore) -> None:
    ids = [await _insert(store, at=T0 + timedelta(minutes=i)) for i in range(3)]
    first = await store.page("acme", None, 2)
    assert [r.id for r in first] == ids[::-1][:2]
    rest = await store.page("acme", (first[-1].create_time, first[-1].id), 2)
    assert [r.id for r in rest] == ids[:1] and await store.page("globex", None, 5) == []


CHECKS = [
    check_a_request_id_names_one_erasure,
    check_a_request_id_is_scoped_to_the_kind_and_seat,
    check_the_steps_are_recorded_as_they_say,
    check_a_run_writes_only_while_its_claim_is_held,
    check_a_transaction_that_raises_leaves_nothing,
    check_the_audit_pages_newest_first,
]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_fake_store_keeps_the_promises(check) -> None:  # type: ignore[no-untyped-def]
    await check(FakeErasureDb().store)
