"""Migrations and the sessions already on the database: each file commits on its own, so the locks
an early file takes end with it, and a file whose table is held by an open transaction waits a
bounded time, says who holds it, and finally refuses in one line (the files before it applied)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg
import pytest

from libs.common import db
from libs.common.db import MigrationBlocked, Migrations, migrate


def _components(root: Path) -> list[Migrations]:
    early, late = root / "early", root / "late"
    for d, table in ((early, "early_t"), (late, "late_t")):
        d.mkdir(parents=True)
        (d / "0001_table.sql").write_text(f"CREATE TABLE {table} (id int);\n")
    return [Migrations("early", early), Migrations("late", late)]


def _second_files(root: Path) -> None:
    """The upgrade: an early file rewrites its table (ACCESS EXCLUSIVE), a later one another's."""
    (root / "early" / "0002_note.sql").write_text("ALTER TABLE early_t ADD COLUMN note text;\n")
    (root / "late" / "0002_note.sql").write_text("ALTER TABLE late_t ADD COLUMN note text;\n")


@pytest.fixture
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "MIGRATION_LOCK_TIMEOUT_S", 0.2)
    monkeypatch.setattr(db, "MIGRATION_RETRY_PAUSE_S", 0.05)


async def _applied(conn: asyncpg.Connection) -> set[tuple[str, int]]:
    return {
        (r["component"], r["version"]) for r in await conn.fetch("SELECT component, version FROM schema_migrations")
    }


async def test_a_reader_of_a_later_files_table_does_not_block_the_tables_an_earlier_file_changed(
    empty_dsn: str, tmp_path: Path, short_waits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "MIGRATION_LOCK_ATTEMPTS", 10_000)
    components = _components(tmp_path)
    await migrate(empty_dsn, components)
    _second_files(tmp_path)
    reader, probe = await asyncpg.connect(empty_dsn), await asyncpg.connect(empty_dsn)
    reading = reader.transaction()
    await reading.start()
    await reader.fetchval("SELECT count(*) FROM late_t")  # ACCESS SHARE on late_t until it ends
    migrating = asyncio.create_task(migrate(empty_dsn, components))
    try:
        async with asyncio.timeout(30):  # one transaction for every file never commits early/0002
            while ("early", 2) not in await _applied(probe):
                await asyncio.sleep(0.05)
        await probe.execute("SET statement_timeout = 5000")
        # The early file's lock ended with its commit: its table reads at once, new column and all.
        assert await probe.fetchval("SELECT count(note) FROM early_t") == 0
        assert not migrating.done()  # the late file still waits for the reader
        await reading.rollback()
        async with asyncio.timeout(30):
            assert await migrating == ["early/0002_note.sql", "late/0002_note.sql"]
        assert await probe.fetchval("SELECT count(note) FROM late_t") == 0
    finally:
        migrating.cancel()
        await reader.close()
        await probe.close()


async def test_a_file_whose_table_stays_held_refuses_in_one_line_naming_the_holder(
    empty_dsn: str,
    tmp_path: Path,
    short_waits: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(db, "MIGRATION_LOCK_ATTEMPTS", 3)
    components = _components(tmp_path)
    await migrate(empty_dsn, components)
    _second_files(tmp_path)
    reader = await asyncpg.connect(empty_dsn)
    try:
        reading = reader.transaction()
        await reading.start()
        await reader.fetchval("SELECT count(*) FROM late_t")
        pid = reader.get_server_pid()
        with caplog.at_level(logging.WARNING, logger="libs.common.db"):
            async with asyncio.timeout(30):
                with pytest.raises(MigrationBlocked) as blocked:
                    await migrate(empty_dsn, components)
        message = str(blocked.value)
        assert "\n" not in message
        assert "late/0002_note.sql" in message and f"pid {pid} (idle in transaction" in message
        assert "late_t" in message and "./run migrate again" in message
        waits = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
        assert len(waits) == 2 and all(f"pid {pid}" in w for w in waits)
        # The early file committed before the late one waited; the late one left nothing behind.
        assert await _applied(reader) >= {("early", 2)}
        assert ("late", 2) not in await _applied(reader)
        await reading.rollback()
        assert await migrate(empty_dsn, components) == ["late/0002_note.sql"]
    finally:
        await reader.close()


async def test_a_second_migrator_waits_for_the_first_and_applies_nothing_twice(
    empty_dsn: str, tmp_path: Path, short_waits: None
) -> None:
    """The advisory lock is held across the files' transactions, not only within one."""
    components = _components(tmp_path)
    for n in range(2, 12):
        (tmp_path / "early" / f"{n:04d}_step.sql").write_text(
            f"ALTER TABLE early_t ADD COLUMN c{n} int; SELECT pg_sleep(0.01);\n"
        )
    results = await asyncio.gather(*(migrate(empty_dsn, components) for _ in range(3)))
    flat = [name for r in results for name in r]
    assert sorted(flat) == sorted(set(flat)) and len(flat) == 12
