"""ListProfiles over many rows: a page finds the other rows of its people through the identifier
indexes (reading about the page, not all the observer's rows as it did on every page), the count
of people is taken on the first page and carried on, and the people listed stay exactly those of
``domain.linked``, each once, at its newest row."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentlearn.profiles.v1 import profile_service_pb2 as pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pb_grpc
from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex
from services.profiles.domain import newest
from services.profiles.store import PostgresProfileStore
from tests.support.app import open_app

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """One connection: the statistics a page's reads leave are that backend's, flushed and read on it."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as one:
        yield one


Row = tuple[str, str, str | None, str | None, int]
"""One of ana's rows: platform, key, handle, external id, seconds after T0 of its update."""


async def add_rows(pool: asyncpg.Pool, rows: list[Row]) -> list[uuid.UUID]:
    """The rows written (as an upsert wrote them before it found a row by either identifier), their ids."""
    ids = [uuid.uuid4() for _ in rows]
    await pool.executemany(
        """INSERT INTO counterparty_profiles (id, company, observer, platform, subject_key, subject_handle,
                                              subject_external_id, observation_count, create_time, update_time)
           VALUES ($1, 'acme', 'ana', $2, $3, $4, $5, 1, $6, $7)""",
        [
            (id_, platform, key, handle, ext, T0 - timedelta(days=1, seconds=at), T0 + timedelta(seconds=at))
            for id_, (platform, key, handle, ext, at) in zip(ids, rows, strict=True)
        ],
    )
    await pool.execute("ANALYZE counterparty_profiles")
    return ids


async def tuples_read(pool: asyncpg.Pool) -> int:
    """The rows of counterparty_profiles the (one) backend has read so far, by scans of either kind."""
    async with pool.acquire() as conn:
        await conn.execute("SET stats_fetch_consistency = none")
        await conn.execute("SELECT pg_stat_force_next_flush()")  # this backend's counts, as of the last statement
        return int(
            await conn.fetchval(
                """SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables
                   WHERE relname = 'counterparty_profiles'"""
            )
        )


async def test_a_later_page_reads_about_its_own_rows_not_all_the_observers(pool: asyncpg.Pool) -> None:
    """Every page grouped all the observer's rows to find the people with several (half a second a
    page of 200 over 100,000 profiles; minutes to page them all). A later page reads the page's
    rows and the rows sharing an identifier with them, whatever the observer holds; only the first
    page counts the people."""
    n = 100_000
    await pool.execute(
        """INSERT INTO counterparty_profiles (id, company, observer, platform, subject_key, subject_handle,
                                              subject_external_id, create_time, update_time)
           SELECT gen_random_uuid(), 'acme', 'ana', 'slack', 'u' || g, 'u' || g, 'E' || g,
                  $1::timestamptz, $1::timestamptz + g * interval '1s'
           FROM generate_series(0, $2::int - 1) g""",
        T0,
        n,
    )
    await pool.execute("ANALYZE counterparty_profiles")
    store = PostgresProfileStore(pool)
    first = await store.page("acme", "ana", None, 11)
    assert first.total == n and len(first.people) == 11
    top = newest(first.people[-1])
    before = await tuples_read(pool)
    later = await store.page("acme", "ana", (top.update_time, top.id), 11, count=False)
    read = await tuples_read(pool) - before
    assert read < 200, read  # about the page (its rows, then theirs by identifier), not n
    assert later.total is None and [newest(p).subject_key for p in later.people] == [f"u{n - i}" for i in range(12, 23)]


def people_of(ids: list[uuid.UUID], rows: list[Row]) -> list[set[uuid.UUID]]:
    """The rows by person, newest person first, worked out here by brute force: rows sharing an
    identifier on their platform, directly or through others, are one person, placed at its most
    recently updated row."""
    groups = [{i} for i in range(len(rows))]
    merged = True
    while merged:
        merged = False
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                names = [{(rows[i][0], x) for i in g for x in rows[i][1:4] if x} for g in (groups[a], groups[b])]
                if names[0] & names[1]:
                    groups[a] |= groups.pop(b)
                    merged = True
                    break
            if merged:
                break
    groups.sort(key=lambda g: max((rows[i][4], ids[i]) for i in g), reverse=True)
    return [{ids[i] for i in g} for g in groups]


async def test_paging_lists_each_person_once_at_its_newest_row(pool: asyncpg.Pool) -> None:
    """People of up to four rows, linked through either identifier (a chain whose newest row names
    only the next), interleaved with one-row people and with the same identifiers on another
    platform (other people): every page size lists each person once with all its rows, at its
    newest row's place, and the first page counts the people."""
    rows: list[Row] = []
    for i in range(12):
        rows.append(("slack", f"solo{i}", f"solo{i}", None, 10 * i))
        rows.append(("teams", f"solo{i}", f"solo{i}", f"E{i}", 10 * i + 1))
    rows += [  # a chain d -(E3)- c -(bob)- b -(E1)- a on slack, and two pairs
        ("slack", "E1", None, "E1", 55),
        ("slack", "bob", "bob", "E1", 3),
        ("slack", "E3", "bob", "E3", 97),
        ("slack", "dee", "dee", "E3", 34),
        ("teams", "E1", None, "E1", 56),  # teams' E1: solo1 there, not the slack chain
        ("slack", "cara", "cara", "E9", 71),
        ("slack", "E9", None, "E9", 72),
    ]
    ids = await add_rows(pool, rows)
    expected = people_of(ids, rows)
    assert len(expected) == len(rows) - 5  # the chain of four is one person, each pair another
    store = PostgresProfileStore(pool)
    for size in (1, 2, 3, 5, 8, 100):
        listed: list[set[uuid.UUID]] = []
        after = None
        while True:
            page = await store.page("acme", "ana", after, size, count=after is None)
            assert len(page.people) <= size and (page.total == len(expected) if after is None else page.total is None)
            listed += [{p.id for p in person} for person in page.people]
            if len(page.people) < size:
                break
            after = (newest(page.people[-1]).update_time, newest(page.people[-1]).id)
        assert listed == expected, size


async def test_the_count_of_people_is_taken_on_the_first_page_and_carried(make_settings, dsn, clock):  # type: ignore[no-untyped-def]
    """total_size is the count the first page took (counting groups all the observer's rows):
    the next pages carry it rather than count again; a listing started afresh counts anew."""
    index = QdrantClientIndex.local()
    try:
        async with open_app(make_settings(), dsn, names=["profiles"], clock=clock, embedder=None, index=index) as app:
            stub = pb_grpc.ProfileServiceStub(app.channel)
            await add_rows(app.infra.pool, [("slack", f"u{i}", f"u{i}", None, i) for i in range(5)])
            first = await stub.ListProfiles(pb.ListProfilesRequest(company="acme", observer="ana", page_size=2))
            assert first.total_size == 5
            await add_rows(app.infra.pool, [("slack", "new", "new", None, 100)])
            token, totals = first.next_page_token, []
            while token:
                page = await stub.ListProfiles(
                    pb.ListProfilesRequest(company="acme", observer="ana", page_size=2, page_token=token)
                )
                totals.append(page.total_size)
                token = page.next_page_token
            assert totals == [5, 5]
            again = await stub.ListProfiles(pb.ListProfilesRequest(company="acme", observer="ana", page_size=2))
            assert again.total_size == 6
    finally:
        await index.close()
