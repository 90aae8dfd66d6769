"""SQL statement spans: by default only a statement slower than the threshold is a span (with its
real start and end and the database semantic-convention attributes); ``all`` spans every statement;
``off`` none (RPC spans are not governed by this: tests/test_telemetry.py). Real PostgreSQL, the real
tracer provider."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.common import db
from libs.common.config import TelemetryConfig


async def _run(dsn: str, exporter: InMemorySpanExporter) -> list:
    pool = await db.connect_pool(dsn, max_size=2)
    try:
        exporter.clear()
        with trace.get_tracer("test").start_as_current_span("request"):
            await pool.fetchval("SELECT 1")
            await pool.execute("SELECT pg_sleep(0.6)")
        return [s for s in exporter.get_finished_spans() if s.name != "request"]
    finally:
        await pool.close()


async def test_by_default_only_a_slow_statement_is_a_span(dsn, spans):
    db.configure_sql_spans("slow", 250)
    found = await _run(dsn, spans)
    assert [s.name for s in found] == ["db select"]  # the sleep, not the SELECT 1
    [slow] = found
    assert slow.attributes["db.system.name"] == "postgresql"
    assert slow.attributes["db.operation.name"] == "SELECT"
    assert "pg_sleep" in slow.attributes["db.query.text"]
    assert slow.kind == trace.SpanKind.CLIENT
    assert (slow.end_time - slow.start_time) >= 500_000_000  # its real duration
    assert slow.parent is not None  # a child of the request's span


async def test_all_spans_every_statement_and_off_none(dsn, spans):
    db.configure_sql_spans("all")
    assert len(await _run(dsn, spans)) == 2
    db.configure_sql_spans("off")
    assert await _run(dsn, spans) == []


def test_the_default_is_slow_statements_only():
    assert TelemetryConfig().sql_spans == "slow"
    with pytest.raises(ValueError):
        db.configure_sql_spans("sometimes")


def test_a_statement_is_named_by_its_main_statement_past_its_ctes():
    from libs.common.db import _span_name

    cte = "WITH e AS (INSERT INTO events (a) SELECT x FROM unnest($1::text[]) AS u(x)), f AS (SELECT 1) "
    assert _span_name(cte + "UPDATE turn_contexts SET state = 'built' WHERE id = $2")[0] == "db update turn_contexts"
    assert _span_name("WITH RECURSIVE s(a, b) AS ((SELECT a, b FROM t) UNION ALL SELECT 1, 2) SELECT a FROM s")[0] == (
        "db select s"
    )
    assert _span_name("  insert into events values (1)")[0] == "db insert events"
    # A SELECT that reads back what its CTEs wrote is named by the first write: the table it changed.
    written = "WITH w AS (UPDATE profiles SET n = n + 1 WHERE id = $1 RETURNING id), "
    recorded = "o AS (INSERT INTO observations (p) SELECT id FROM w) SELECT * FROM w"
    assert _span_name(written + recorded)[:3] == ("db update profiles", "UPDATE", "profiles")
    # ... and by the write it reads back when that is not the first (a key claimed on the way).
    claimed = "WITH claim AS (INSERT INTO diary_requests (k) SELECT $1 RETURNING k), "
    stored = "ins AS (INSERT INTO agent_diary (id) SELECT $2 WHERE EXISTS (SELECT 1 FROM claim) RETURNING id) "
    assert _span_name(claimed + stored + "SELECT id FROM ins")[0] == "db insert agent_diary"
    assert _span_name("WITH r AS (SELECT 1 AS a) SELECT a FROM r")[0] == "db select r"
    # A transaction's own statements (asyncpg's, or ``unflushed``'s) say what they are.
    assert _span_name("BEGIN; SET LOCAL synchronous_commit = off")[:2] == ("db begin", "BEGIN")
    assert _span_name("COMMIT")[0] == "db commit" and _span_name("ROLLBACK;")[0] == "db rollback"
