"""The reflector's move onto the shared queue: a database migrated before it keeps every job (queued
ones still run), keyed by seat and run id, and the records' key names the seat."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.common.db import COMMON_MIGRATIONS, Migrations, migrate
from libs.common.jobs import JobQueue, JobState
from services.reflector.bootstrap import MIGRATIONS
from services.reflector.domain import job_key, turn_id_of
from services.runner.registry import SERVICES

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_old_reflection_jobs_move_to_background_jobs_keyed_by_seat(empty_dsn, tmp_path):
    before = tmp_path / "reflector-0001"
    before.mkdir()
    shutil.copy(MIGRATIONS.directory / "0001_reflection.sql", before)
    await migrate(empty_dsn, [COMMON_MIGRATIONS, Migrations("reflector", before)])
    conn = await asyncpg.connect(empty_dsn)
    try:
        for seat, run, state, attempts in [("ana", "run-1", "queued", 0), ("ops/x%y", "run/2", "done", 3)]:
            await conn.execute(
                """INSERT INTO reflection_jobs (kind, key, company, seat, payload, trace_carrier, state, attempts,
                                                run_after, create_time)
                   VALUES ('reflection', $1, 'acme', $2, $3, '{"traceparent": "t"}', $4, $5, $6, $6)""",
                run,
                seat,
                run.encode(),
                state,
                attempts,
                T0,
            )
            await conn.execute(
                "INSERT INTO reflections (company, seat, turn_id, state, submit_time) VALUES ('acme', $1, $2, $3, $4)",
                seat,
                run,
                "completed" if state == "done" else "queued",
                T0,
            )
        await migrate(empty_dsn, [COMMON_MIGRATIONS, *[s.MIGRATIONS for s in SERVICES.values()]])
        assert await conn.fetchval("SELECT to_regclass('reflection_jobs')") is None
        rows = await conn.fetch("SELECT kind, key, seat, state, attempts, payload FROM background_jobs ORDER BY id")
        assert [(r["kind"], r["key"], r["state"], r["attempts"]) for r in rows] == [
            ("reflection", job_key("ana", "run-1"), "queued", 0),
            ("reflection", job_key("ops/x%y", "run/2"), "done", 3),
        ]
        assert [turn_id_of(r["key"]) for r in rows] == ["run-1", "run/2"]
        # The seat is part of a record's key now: another seat's run-1 is its own row.
        await conn.execute(
            "INSERT INTO reflections (company, seat, turn_id, state, submit_time) VALUES ('acme', 'bob', 'run-1', "
            "'queued', $1)",
            T0,
        )
        assert await conn.fetchval("SELECT count(*) FROM reflections WHERE turn_id = 'run-1'") == 2
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(empty_dsn, min_size=1, max_size=2)
    try:
        queue = JobQueue(pool)
        job = await queue.claim("reflection", "w", T0, 30)  # the queued one still runs
        assert (job.seat, job.payload, job.trace_carrier) == ("ana", b"run-1", {"traceparent": "t"})
        _, state, _ = await queue.get("reflection", "acme", job_key("ops/x%y", "run/2"))
        assert state == JobState.DONE
    finally:
        await pool.close()


def test_a_job_key_is_unambiguous():
    assert job_key("a/b", "c") != job_key("a", "b/c")
    assert job_key("a%2Fb", "c") != job_key("a/b", "c")
    assert turn_id_of(job_key("a/b%", "x/y")) == "x/y"


async def test_one_state_machine_brings_records_in_step_and_takes_only_its_states(empty_dsn, tmp_path):
    """0004: a record left QUEUED beside a dead-lettered queue row (an unreadable turn, before the
    one state machine) is dead-lettered with its reason; the column takes only the machine's states."""
    before = tmp_path / "reflector-0003"
    before.mkdir()
    for name in ("0001_reflection.sql", "0002_shared_queue.sql", "0003_erasures.sql"):
        shutil.copy(MIGRATIONS.directory / name, before)
    await migrate(empty_dsn, [COMMON_MIGRATIONS, Migrations("reflector", before)])
    conn = await asyncpg.connect(empty_dsn)
    try:
        rows_before = [("ops/x", "run-1", "dead", "queued"), ("ana", "run-2", "done", "completed")]
        for seat, run, job_state, state in rows_before:
            await conn.execute(
                """INSERT INTO background_jobs (kind, key, company, seat, payload, state, reason, run_after,
                                                create_time, finish_time)
                   VALUES ('reflection', $1, 'acme', $2, '', $3, 'unreadable: x', $4, $4, $4)""",
                job_key(seat, run),
                seat,
                job_state,
                T0,
            )
            await conn.execute(
                "INSERT INTO reflections (company, seat, turn_id, state, submit_time) VALUES ('acme', $1, $2, $3, $4)",
                seat,
                run,
                state,
                T0,
            )
        await migrate(empty_dsn, [COMMON_MIGRATIONS, *[s.MIGRATIONS for s in SERVICES.values()]])
        rows = await conn.fetch("SELECT turn_id, state, reason FROM reflections ORDER BY turn_id")
        assert [(r["turn_id"], r["state"], r["reason"]) for r in rows] == [
            ("run-1", "dead_lettered", "unreadable: x"),
            ("run-2", "completed", None),
        ]
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE reflections SET state = 'finished' WHERE turn_id = 'run-2'")
    finally:
        await conn.close()
