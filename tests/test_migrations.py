"""Ordered migrations, applied once even when two processes start at the same moment."""

from __future__ import annotations

import asyncio

import asyncpg

from libs.common.db import COMMON_MIGRATIONS, migrate
from services.runner.registry import SERVICES


async def test_two_processes_starting_at_once_apply_each_migration_exactly_once(empty_dsn):
    components = [COMMON_MIGRATIONS, *[m.MIGRATIONS for m in SERVICES.values()]]
    first, second = await asyncio.gather(migrate(empty_dsn, components), migrate(empty_dsn, components))
    assert sorted(first + second) == sorted(set(first + second))  # nothing applied twice
    assert len(first + second) == sum(len(c.files()) for c in components)
    conn = await asyncpg.connect(empty_dsn)
    try:
        rows = await conn.fetch("SELECT component, version FROM schema_migrations ORDER BY component, version")
        assert len(rows) == len(first + second)
        assert await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'") >= "0.8"
    finally:
        await conn.close()
    assert await migrate(empty_dsn, components) == []  # a restart applies nothing


async def test_migrations_apply_in_file_order(empty_dsn):
    applied = await migrate(empty_dsn, [COMMON_MIGRATIONS])
    assert applied == [f"common/{p.name}" for _, p in COMMON_MIGRATIONS.files()]
