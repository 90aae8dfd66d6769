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


async def test_a_service_that_may_not_migrate_refuses_a_schema_behind_then_starts_after_migrate(
    empty_dsn, make_settings, edge_index
):
    """Kubernetes: services run with database.migrate_on_start false (no DDL rights); a schema
    behind is one line naming ./run migrate, and after the migrate Job the same start succeeds, on
    a PgBouncer-friendly pool (no prepared-statement cache)."""
    import contextlib

    import pytest

    from libs.common.infra import SchemaBehind, open_infra
    from services.runner.registry import migrations_of

    settings = make_settings(database={"migrate_on_start": False, "statement_cache_size": 0, "pool_size": 2})
    with pytest.raises(SchemaBehind, match=r"run \./run migrate") as err:
        async with contextlib.AsyncExitStack() as stack:
            await open_infra(settings, stack, migrations_of(["diary"]), embedder=None, index=edge_index, dsn=empty_dsn)
    assert "\n" not in str(err.value)
    await migrate(empty_dsn, [COMMON_MIGRATIONS, *migrations_of(["diary"])])
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, migrations_of(["diary"]), embedder=None, index=edge_index, dsn=empty_dsn
        )
        assert infra.pool.get_max_size() == 2
        assert await infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 0
