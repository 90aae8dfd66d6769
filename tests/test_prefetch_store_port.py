"""The prefetch store port's decisions on the real PostgreSQL store: the same checks the unit tier
runs on the in-memory fake (tests/unit/test_prefetch_store_decisions.py), so the fake cannot drift
from what the statements decide."""

from __future__ import annotations

import pytest

from libs.common.db import connect_pool
from services.prefetch.store import PostgresPrefetchStore
from tests.unit.test_prefetch_store_decisions import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_postgres_store_decides_as_the_fake(check, dsn: str) -> None:  # type: ignore[no-untyped-def]
    pool = await connect_pool(dsn)
    try:
        await check(PostgresPrefetchStore(pool))
    finally:
        await pool.close()
