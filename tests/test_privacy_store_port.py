"""The erasure store port's promises on the real PostgreSQL store: the same checks the unit tier
runs on the in-memory fake (tests/unit/test_privacy_store.py)."""

from __future__ import annotations

import pytest

from libs.common.db import connect_pool
from services.privacy.store import PostgresErasureStore
from tests.unit.test_privacy_store import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_postgres_store_keeps_the_promises(check, dsn: str) -> None:  # type: ignore[no-untyped-def]
    pool = await connect_pool(dsn)
    try:
        await check(PostgresErasureStore(pool))
    finally:
        await pool.close()


async def test_a_stale_holder_writes_nothing_into_the_erasure_another_holder_finished(dsn: str, clock) -> None:  # type: ignore[no-untyped-def]
    """Holder A's collection call hangs past its lease (its renewals unanswered); holder B takes the
    erasure again and finishes it SUCCEEDED, the target dropped. A's call then returns: its writes
    are fenced by its claim, so it stops with nothing written — it used to write the person's
    identifiers (and its rounds and reports) back into the SUCCEEDED audit row."""
    import asyncio
    import uuid

    from libs.common.config import PrivacyConfig
    from libs.common.erasure import Kind, Target
    from libs.common.jobs import JobQueue
    from services.privacy.service import PrivacyService
    from services.privacy.worker import ErasureWorker
    from tests.unit.fakes.events import RecordedEvents
    from tests.unit.fakes.privacy import FakeOwners, Row

    class SlowOwners(FakeOwners):
        gate = asyncio.Event()
        entered = asyncio.Event()

        async def find(self, owner, target):  # type: ignore[no-untyped-def]
            self.entered.set()
            await self.gate.wait()  # A's collection call hangs (a slow owner, a frozen process)
            return await super().find(owner, target)

    class RenewDown(JobQueue):
        async def renew(self, job, worker, now, lease_seconds):  # type: ignore[no-untyped-def]
            raise ConnectionError("renewal not answered")

    def rows() -> dict[str, list[Row]]:
        return {
            "diary": [Row("n1", "agent_diary", subject="bob")],
            "episodes": [Row("e1", "episodes", subject="bob", turn_id="r1")],
        }

    pool = await connect_pool(dsn)
    try:
        cfg = PrivacyConfig(claim_lease_seconds=60.0)
        store, events = PostgresErasureStore(pool), RecordedEvents()
        slow, owners_b = SlowOwners(rows=rows()), FakeOwners(rows=rows())
        queue_a, queue_b = RenewDown(pool), JobQueue(pool)
        service_a = PrivacyService(store, queue_a, slow, clock, events, cfg)
        service_b = PrivacyService(store, queue_b, owners_b, clock, events, cfg)
        worker_a = ErasureWorker(service_a, queue_a, cfg, clock, events, "holder-A")
        worker_b = ErasureWorker(service_b, queue_b, cfg, clock, events, "holder-B")
        target = Target(uuid.uuid4(), "acme", Kind.SUBJECT, handle="bob", platform="slack", names=("Bob Smith",))
        eid = (await service_b.request(target, "req-1")).id
        a = asyncio.create_task(worker_a.drain())
        await asyncio.wait_for(slow.entered.wait(), 30)
        clock.advance(seconds=61)  # A's lease lapsed while its call hangs
        assert await worker_b.drain() == 1
        row = await pool.fetchrow("SELECT state, target FROM erasures WHERE id = $1", eid)
        assert (row["state"], row["target"]) == ("succeeded", None)
        slow.gate.set()
        await a
        row = await pool.fetchrow("SELECT state, target, collected, round FROM erasures WHERE id = $1", eid)
        assert (row["state"], row["target"]) == ("succeeded", None), "her identifiers are back in the audit"
    finally:
        await pool.close()
