"""The reflection store port's promises on the real PostgreSQL store: the same checks the unit tier
runs on the in-memory fake (tests/unit/test_reflector_harness_store.py), so the fake the harness's
unit tests run on cannot drift from what the guarded statements do."""

from __future__ import annotations

import pytest

from libs.common.db import connect_pool
from libs.common.jobs import JobQueue
from services.reflector.store import PostgresReflectionStore
from tests.unit.test_reflector_harness_store import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_postgres_store_keeps_the_promises(check, dsn: str) -> None:  # type: ignore[no-untyped-def]
    pool = await connect_pool(dsn)
    try:
        await check(PostgresReflectionStore(pool), JobQueue(pool))
    finally:
        await pool.close()
