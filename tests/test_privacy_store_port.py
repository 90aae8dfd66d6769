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
