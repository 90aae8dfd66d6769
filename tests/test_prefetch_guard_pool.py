"""``refresh_memory``'s one-at-a-time guard (``PostgresPrefetchStore.one_at_a_time``) held a pooled
connection for its whole section while the guarded work took others from the same pool: with as
many concurrent refreshes of different runs as the pool had connections, every connection was a
guard's and every refresh waited on the pool until its deadline. The guard is now a lease on the
run's ledger row and holds no connection while held. Real builtins over the real services on the
embedded PostgreSQL, the prefetch's store on a pool of three connections."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from libs.common.db import connect_pool
from services.prefetch.builtins import Builtins
from services.prefetch.store import PostgresPrefetchStore
from tests.test_prefetch_support import counting_env

WAIT = 30.0  # a bound on what takes a second or two: the starved refreshes used to wait for ever
POOL = 3
REFRESHES = 7  # more concurrent refreshes of different runs than the pool has connections


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with counting_env(make_settings, dsn, clock, local_embedder, edge_index) as e:
        yield e


async def test_more_concurrent_refreshes_than_the_pool_has_connections_all_complete(env, dsn):
    notes = [
        await env.note("Bob prefers weekly digests of the billing export, sent on Mondays."),
        await env.note("The billing export runs from the finance dashboard."),
    ]
    pool = await connect_pool(dsn, max_size=POOL)
    try:
        prefetch = env.service
        deps = dataclasses.replace(prefetch.deps, store=PostgresPrefetchStore(pool))
        builtins = Builtins(deps, prefetch.builtins.past_turns)
        refreshes = [
            builtins.refresh_memory("acme", "ana", f"run-{i}", "billing export digest", 0, (), "swe")
            for i in range(REFRESHES)
        ]
        async with asyncio.timeout(WAIT):
            answers = await asyncio.gather(*refreshes)
    finally:
        await pool.close()
    assert [(a.spent, a.from_ledger) for a in answers] == [(1, False)] * REFRESHES  # each its run's first
    assert all(set(a.note_ids) <= set(notes) and a.note_ids for a in answers)
    # Every refresh ran to its end: each showed its notes and counted their uses.
    assert sum([await env.uses(n) for n in notes]) == sum(len(a.note_ids) for a in answers)
