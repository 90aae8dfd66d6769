"""The skill's row lock checks a request id in the same statement (``store.skill_row(key,
request_id)``): a redelivery is seen whether its version is live or archived, and when the row moved
while the lock was awaited (the statement's snapshot is older than the row it locked), the check is
made again under the lock, so an edit committed meanwhile is not missed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.db import connect_pool
from services.skills.domain import SkillChange, SkillDraft, SkillEdit, SkillKey, SkillTrigger
from services.skills.store import PostgresSkillStore

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DRAFT = SkillDraft("notes", "write notes", "# Notes\n", ("a", "b"), SkillTrigger.SINGLE, 1, ("seed",))


def _edit(body: str, request_id: str) -> SkillEdit:
    return SkillEdit(body, SkillChange.REFINED, "r", Provenance(), request_id=request_id)


async def test_a_request_is_seen_live_or_archived_and_rechecked_when_the_row_moved(dsn: str) -> None:
    pool = await connect_pool(dsn)
    try:
        store = PostgresSkillStore(pool)
        async with store.seat("acme", "ana") as tx:
            skill = await tx.insert(DRAFT, Provenance(), T0)
        key = SkillKey("acme", "ana", id=skill.id)
        async with store.skill_row(key, "r-1") as (conn, locked, seen):
            assert locked is not None and not seen
            await store.new_version(conn, locked, _edit("# Notes\n1\n", "r-1"), T0, 5, "- 1")
        async with store.skill_row(key, "r-1") as (_, _, seen):
            assert seen  # the live version's
        # Two edits in a transaction the lock waits for: r-2 is archived by r-3 meanwhile.
        async with store.skill_row(key) as (conn, locked, _):
            assert locked is not None
            edited = await store.new_version(conn, locked, _edit("# Notes\n2\n", "r-2"), T0, 5)
            waiting = asyncio.create_task(_seen(store, key, "r-2"))
            await _until_a_lock_is_awaited(pool)  # the task's statement has its snapshot and waits
            await store.new_version(conn, edited, _edit("# Notes\n3\n", "r-3"), T0, 5)
        assert await waiting
        async with store.skill_row(key, "r-4") as (_, locked, seen):
            assert locked is not None and locked.version == 4 and not seen
        assert await pool.fetchval("SELECT count(*) FROM skill_practice_bullets WHERE skill_id = $1", skill.id) == 1
    finally:
        await pool.close()


async def _seen(store: PostgresSkillStore, key: SkillKey, request_id: str) -> bool:
    async with store.skill_row(key, request_id) as (_, _, seen):
        return seen


async def _until_a_lock_is_awaited(pool: asyncpg.Pool) -> None:
    """Returns once some statement waits for a row lock (the edits' transaction holds the only one)."""
    async with asyncio.timeout(30):
        while not await pool.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"):
            await asyncio.sleep(0.01)
