"""An erasure job's steps on in-memory fakes of the store, the queue and the owners (tests/unit/
fakes/privacy.py): collect the person's run ids, erase every owner in order, verify, and finish
SUCCEEDED (the target dropped) — or another round for rows written meanwhile, FAILED with the
residues named after the last round, retried while an owner is down or the index is behind, a
resumed job asking no owner twice. No Postgres, no gRPC."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from libs.common.clock import ManualClock
from libs.common.config import PrivacyConfig
from libs.common.erasure import Kind, Target, round_id
from libs.common.errors import InvalidArgument
from libs.common.jobs import JobState
from services.privacy.domain import COLLECTORS, ERASE_ORDER, MAX_ROUNDS, ErasureState
from services.privacy.service import PrivacyService
from services.privacy.worker import ErasureWorker
from tests.unit.fakes.privacy import FakeErasureDb, FakeOwners, Row
from tests.unit.fakes.reflector import FakeEvents

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Rig:
    def __init__(self, owners: FakeOwners, *, max_attempts: int = 3):
        self.clock = ManualClock(T0)
        self.db = FakeErasureDb()
        self.owners = owners
        self.events = FakeEvents()
        self.config = PrivacyConfig(max_attempts=max_attempts, retry_seconds=30)
        self.service = PrivacyService(self.db.store, self.db.queue, owners, self.clock, self.events, self.config)
        self.worker = ErasureWorker(self.service, self.db.queue, self.config, self.clock, self.events, "holder-1")

    async def request(self, request_id: str | None = None) -> uuid.UUID:
        target = Target(uuid.uuid4(), "acme", Kind.SUBJECT, handle="bob", platform="slack")
        return (await self.service.request(target, request_id)).id

    def row(self, erasure_id: uuid.UUID):  # type: ignore[no-untyped-def]
        return self.db.state.erasures[erasure_id]


def _people() -> FakeOwners:
    """Bob is named by a diary note and a profile; his run r1 left an episode and a reflection."""
    return FakeOwners(
        rows={
            "diary": [Row("n1", "agent_diary", subject="bob"), Row("n2", "agent_diary", subject="ann")],
            "profiles": [Row("p1", "profiles", subject="bob")],
            "episodes": [Row("e1", "episodes", subject="bob", turn_id="r1"), Row("e2", "episodes", turn_id="r1")],
            "reflector": [Row("f1", "reflections", turn_id="r1")],
        }
    )


async def test_a_persons_erasure_collects_erases_in_order_verifies_and_drops_the_target() -> None:
    rig = Rig(_people())
    eid = await rig.request()
    assert rig.row(eid).state is ErasureState.QUEUED and rig.db.job().state == JobState.QUEUED

    assert await rig.worker.drain() == 1
    row = rig.row(eid)
    assert (row.state, row.verified, row.reason) == (ErasureState.SUCCEEDED, True, "")
    assert row.target is None and row.collected  # the person's identifiers left the audit
    assert rig.db.job().state == JobState.DONE
    # Collect first (the owners that know run ids), then every owner erased in ERASE_ORDER, then verified.
    finds = [o for call, o, _ in rig.owners.calls if call == "find"]
    erases = [o for call, o, _ in rig.owners.calls if call == "erase"]
    assert finds[: len(COLLECTORS)] == list(COLLECTORS) and finds[len(COLLECTORS) :] == list(ERASE_ORDER)
    assert erases == list(ERASE_ORDER)
    # The run id the episodes owner reported reached every owner: the reflection of r1 is gone too,
    # and what did not name bob stays.
    assert {o: r.total for o, r in row.reports.items() if r.total} == {
        "diary": 1,
        "profiles": 1,
        "episodes": 2,
        "reflector": 1,
    }
    assert [r.id for r in rig.owners.rows["diary"]] == ["n2"]
    assert rig.events.kinds() == ["erasure_requested", "erasure_finished"]


async def test_a_request_id_queues_one_erasure_and_a_person_needs_an_identifier() -> None:
    rig = Rig(_people())
    first = await rig.request("req-1")
    assert await rig.request("req-1") == first and len(rig.db.queue.jobs) == 1
    with pytest.raises(InvalidArgument) as refused:
        await rig.service.request(Target(uuid.uuid4(), "acme", Kind.SUBJECT), None)
    assert refused.value.reason == "SUBJECT_REQUIRED"


async def test_rows_written_after_the_erase_step_start_another_round_under_its_own_id() -> None:
    owners = _people()
    # A reflection of bob's run r2 that was running lands after the diary's erase: the diary's
    # verification finds it, and its run id reaches every owner in round 2.
    owners.written_late["diary"] = [Row("n3", "agent_diary", subject="bob", turn_id="r2")]
    owners.rows["episodes"].append(Row("e3", "episodes", turn_id="r2"))
    rig = Rig(owners)
    eid = await rig.request()
    await rig.worker.drain()
    row = rig.row(eid)
    assert (row.state, row.round) == (ErasureState.SUCCEEDED, 2)
    assert {"diary#2", "episodes#2"} <= set(row.reports)
    round2 = {o for call, o, asked in owners.calls if call == "erase" and asked == round_id(eid, 2)}
    assert round2 == set(ERASE_ORDER)
    assert [r.id for r in owners.rows["diary"]] == ["n2"] and owners.rows["episodes"] == []
    # The receipt folds both rounds into one report per owner.
    assert rig.service.counts(row)["diary"] == 2


async def test_what_the_last_round_still_finds_is_failed_with_the_residues_named() -> None:
    class Stubborn(FakeOwners):
        """The profiles owner reports an erase but its rows stay (a bug on its side)."""

        async def erase(self, owner: str, target: Target):  # type: ignore[no-untyped-def]
            report = await super().erase(owner, target)
            if owner == "profiles":
                self.rows["profiles"] = [Row("p1", "profiles", subject="bob")]
            return report

    rig = Rig(Stubborn(rows=_people().rows))
    eid = await rig.request()
    await rig.worker.drain()
    row = rig.row(eid)
    assert (row.state, row.verified, row.round) == (ErasureState.FAILED, False, MAX_ROUNDS)
    assert set(row.residues) == {"profiles"} and row.reason.startswith("the verification still found rows: profiles")
    assert rig.db.job().state == JobState.DONE and row.target is None


async def test_an_owner_down_retries_the_job_and_the_resumed_run_asks_no_owner_twice() -> None:
    owners = _people()
    owners.down.add("skills")
    rig = Rig(owners)
    eid = await rig.request()
    await rig.worker.drain()
    row, job = rig.row(eid), rig.db.job()
    assert row.state is ErasureState.RUNNING and row.reason.startswith("an owner failed: UNAVAILABLE")
    assert (job.state, job.run_after) == (JobState.QUEUED, T0 + timedelta(seconds=30))
    erased_before = {o for o in row.reports}
    assert erased_before == set(ERASE_ORDER[: ERASE_ORDER.index("skills")])

    owners.down.clear()
    owners.calls.clear()
    rig.clock.set(job.run_after)
    await rig.worker.drain()
    assert rig.row(eid).state is ErasureState.SUCCEEDED
    again = [o for call, o, _ in owners.calls if call == "erase"]
    assert again == [o for o in ERASE_ORDER if o not in erased_before]
    assert owners.calls[0] == ("erase", "skills", eid)  # collected once: the resumed run starts at skills


async def test_an_owner_down_past_max_attempts_fails_the_erasure_with_its_reason() -> None:
    owners = _people()
    owners.down.add("diary")
    rig = Rig(owners, max_attempts=2)
    eid = await rig.request()
    for _ in range(2):
        await rig.worker.drain()
        rig.clock.advance(seconds=30)
    row = rig.row(eid)
    assert row.state is ErasureState.FAILED and row.reason.startswith("gave up after 2 attempts: an owner failed")
    assert rig.db.job().state == JobState.DONE and row.target is None


async def test_an_index_behind_keeps_the_erasure_unverified_and_retried_until_it_catches_up() -> None:
    owners = _people()
    owners.index_behind["diary"] = 2
    rig = Rig(owners)
    eid = await rig.request()
    await rig.worker.drain()
    row, job = rig.row(eid), rig.db.job()
    assert row.state is ErasureState.RUNNING and "vector points" in row.reason and job.state == JobState.QUEUED

    del owners.index_behind["diary"]  # the index is back: the repeat drops the points
    rig.clock.set(job.run_after)
    await rig.worker.drain()
    row = rig.row(eid)
    assert (row.state, row.verified) == (ErasureState.SUCCEEDED, True)


async def test_an_index_check_that_cannot_run_is_reported_pending_at_the_last_attempt() -> None:
    owners = _people()
    owners.unsearchable.add("episodes")
    rig = Rig(owners, max_attempts=1)
    eid = await rig.request()
    await rig.worker.drain()
    row = rig.row(eid)
    assert (row.state, row.verified, row.pending_checks) == (ErasureState.FAILED, False, ["episodes"])
    assert row.reason == "verification pending: episodes could not be searched (the index was down)"


async def test_an_unreadable_job_is_dead_lettered_and_a_finished_erasure_is_not_run_again() -> None:
    rig = Rig(_people())
    eid = await rig.request()
    await rig.worker.drain()
    calls = len(rig.owners.calls)
    rig.db.job().state = JobState.QUEUED  # handed out again (a redelivery)
    assert await rig.worker.drain() == 1
    assert len(rig.owners.calls) == calls and rig.db.job().state == JobState.DONE
    assert rig.row(eid).state is ErasureState.SUCCEEDED

    async with rig.db.store.transaction() as tx:
        await rig.db.queue.enqueue(
            tx, kind="erasure", key="bad", company="acme", seat="", payload=b"{}", trace_carrier={}, now=T0
        )
    await rig.worker.drain()
    bad = next(j for j in rig.db.queue.jobs.values() if j.job.key == "bad")
    assert bad.state == JobState.DEAD and (bad.reason or "").startswith("unreadable payload")


async def test_a_store_fault_mid_run_is_retried_and_resumes_from_what_was_recorded() -> None:
    rig = Rig(_people())
    eid = await rig.request()
    rig.db.store.fail.add("put_report")
    await rig.worker.drain()
    row, job = rig.row(eid), rig.db.job()
    assert row.state is ErasureState.RUNNING and row.reason.startswith("ConnectionError")
    assert job.state == JobState.QUEUED
    rig.clock.set(job.run_after)
    await rig.worker.drain()
    assert rig.row(eid).state is ErasureState.SUCCEEDED


async def test_the_audit_pages_newest_first() -> None:
    rig = Rig(_people())
    ids = []
    for _ in range(3):
        ids.append(await rig.request())
        rig.clock.advance(minutes=1)
    rows, token = await rig.service.list("acme", 2, "")
    assert [r.id for r in rows] == ids[::-1][:2] and token
    rest, token2 = await rig.service.list("acme", 2, token)
    assert [r.id for r in rest] == ids[:1] and not token2
