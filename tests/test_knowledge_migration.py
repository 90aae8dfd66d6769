"""knowledge_pages moves from the prefetch's migrations to the knowledge service's own: a database
the prefetch migrated before keeps every page (same ids, vectors, parents), gains nothing twice and
ends with the same indexes a fresh database gets; the knowledge service reads the old rows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from agentlearn.knowledge.v1 import knowledge_service_pb2 as pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as pb_grpc
from libs.common.db import COMMON_MIGRATIONS, Migrations, migrate
from services.runner.registry import SERVICES
from tests.support.app import open_app
from tests.support.databases import scratch_database

LEGACY = Migrations("prefetch", Path(__file__).parent / "support" / "legacy_prefetch_migrations")
"""The prefetch's migrations as they shipped, when 0002/0003 created knowledge_pages."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAGE = "6b1f9a3e-3b3e-4c55-9d2a-0c1f2e3d4a5b"


async def _indexes(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'knowledge_pages'")
    return {r["indexname"] for r in rows}


async def test_a_database_the_prefetch_migrated_keeps_its_pages(empty_dsn, pg_uri, make_settings, clock, edge_index):
    await migrate(empty_dsn, [COMMON_MIGRATIONS, LEGACY])
    conn = await asyncpg.connect(empty_dsn)
    try:
        await conn.execute(
            """INSERT INTO knowledge_pages (id, company, container, title, body, parent_titles, create_time,
                                            update_time, embedding_model, embedding_dims, indexed)
               VALUES ($1::uuid, 'acme', 'ops', 'Deploy runbook', 'Ship with make ship.', '{Runbooks}', $2, $2,
                       NULL, NULL, false)""",
            PAGE,
            T0,
        )
        applied = await migrate(empty_dsn, [COMMON_MIGRATIONS, *[s.MIGRATIONS for s in SERVICES.values()]])
        assert "knowledge/0001_knowledge_pages.sql" in applied
        shipped = {f"prefetch/{f.name}" for f in LEGACY.directory.glob("*.sql")}
        assert not [a for a in applied if a in shipped]  # the shipped numbers stand (later ones are new)
        row = await conn.fetchrow("SELECT title, body, parent_titles FROM knowledge_pages WHERE id = $1::uuid", PAGE)
        assert (row["title"], row["body"], list(row["parent_titles"])) == (
            "Deploy runbook",
            "Ship with make ship.",
            ["Runbooks"],
        )
        legacy_indexes = await _indexes(conn)
        assert "knowledge_pages_unfilled" not in legacy_indexes
        assert await migrate(empty_dsn, [COMMON_MIGRATIONS, *[s.MIGRATIONS for s in SERVICES.values()]]) == []
    finally:
        await conn.close()

    # The same indexes as a fresh database.
    async with scratch_database(pg_uri, "f") as fresh:
        await migrate(fresh, [COMMON_MIGRATIONS, *[s.MIGRATIONS for s in SERVICES.values()]])
        fconn = await asyncpg.connect(fresh)
        try:
            assert await _indexes(fconn) == legacy_indexes
            assert (
                await fconn.fetchval(
                    "SELECT count(*) FROM schema_migrations WHERE component = 'prefetch' AND version IN (2, 3)"
                )
                == 2
            )
        finally:
            await fconn.close()

    # The knowledge service reads the old page.
    async with open_app(
        make_settings(companies={"acme": {"roles": {"sre": {"knowledge_containers": ["ops"]}}}}),
        empty_dsn,
        names=["knowledge"],
        clock=clock,
        embedder=None,
        index=edge_index,
    ) as app:
        stub = pb_grpc.KnowledgeServiceStub(app.channel)
        found = await stub.SearchPages(
            pb.SearchPagesRequest(reader=pb.Reader(company="acme", seat="ana", role="sre"), query="deploy runbook")
        )
        assert [h.page_id for h in found.hits] == [PAGE]
