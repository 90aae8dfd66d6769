"""ProfileService: one profile per (observer, subject, platform), merged observation by
observation (deduplicated, newest first, bounded), private to its observer, never of the observer
itself; concurrent observations all land; reads in the order asked; pages with checked tokens."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import grpc
import pytest

from agentlearn.profiles.v1 import profile_service_pb2 as pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex
from services.profiles.domain import item_key, merge_list
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

BOB = pb.Subject(handle="bob", platform="slack")


@pytest.fixture
async def profiles(make_settings, dsn, clock):
    index = QdrantClientIndex.local()
    try:
        async with open_app(make_settings(), dsn, names=["profiles"], clock=clock, embedder=None, index=index) as app:
            yield app, pb_grpc.ProfileServiceStub(app.channel)
    finally:
        await index.close()


def upsert(stub, subject=BOB, observer="ana", company="acme", turn_id="", **fields):  # type: ignore[no-untyped-def]
    return stub.UpsertProfile(
        pb.UpsertProfileRequest(company=company, observer=observer, subject=subject, turn_id=turn_id, **fields)
    )


async def refused(call) -> tuple:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return error_info(exc.value)


async def rows(app) -> int:  # type: ignore[no-untyped-def]
    return await app.infra.pool.fetchval("SELECT count(*) FROM counterparty_profiles")


# ------------------------------------------------------------------------------------------ merge


async def test_first_observation_creates_the_profile_and_the_next_merges_into_it(profiles, clock):
    app, stub = profiles
    first = await upsert(
        stub,
        turn_id="run-1",
        communication_style="Terse; wants bullet points.",
        past_decisions=["Chose Postgres over Mongo"],
        sensitivities=["Deadlines"],
        topics=["billing", "Latency"],
    )
    assert first.created
    p = first.profile
    assert (p.company, p.observer, p.subject.handle, p.subject.platform) == ("acme", "ana", "bob", "slack")
    assert p.observation_count == 1 and p.last_turn_id == "run-1"
    assert list(p.topics) == ["billing", "Latency"]
    assert (
        p.create_time.ToDatetime(tzinfo=clock.now().tzinfo)
        == clock.now()
        == p.update_time.ToDatetime(tzinfo=clock.now().tzinfo)
    )

    later = clock.advance(hours=2)
    second = await upsert(
        stub,
        turn_id="run-2",
        past_decisions=["Ship on Fridays is banned"],
        # Re-observed in another spelling: one item, moved to the front in its newest spelling.
        topics=["  LATENCY ", "pricing", "latency"],
        sensitivities=["deadlines"],
    )
    assert not second.created
    q = second.profile
    assert q.id == p.id
    assert q.observation_count == 2 and q.last_turn_id == "run-2"
    assert list(q.topics) == ["LATENCY", "pricing", "billing"]
    assert list(q.past_decisions) == ["Ship on Fridays is banned", "Chose Postgres over Mongo"]
    assert list(q.sensitivities) == ["deadlines"]
    assert q.communication_style == "Terse; wants bullet points."  # empty style keeps the stored one
    assert q.create_time == p.create_time
    assert q.update_time.ToDatetime(tzinfo=later.tzinfo) == later
    assert await rows(app) == 1


async def test_style_is_replaced_by_a_new_one_and_kept_when_none_is_observed(profiles):
    _, stub = profiles
    await upsert(stub, communication_style="Formal.")
    kept = await upsert(stub, communication_style="   ", topics=["hiring"])
    assert kept.profile.communication_style == "Formal."
    replaced = await upsert(stub, communication_style="Casual, emoji-heavy.")
    assert replaced.profile.communication_style == "Casual, emoji-heavy."
    assert replaced.profile.observation_count == 3


async def test_lists_are_bounded_and_the_oldest_items_go_first(profiles):
    _, stub = profiles
    await upsert(stub, topics=[f"topic {i}" for i in range(30)], past_decisions=[f"decision {i}" for i in range(20)])
    resp = await upsert(stub, topics=["new a", "new b"], past_decisions=["decision new"])
    topics = list(resp.profile.topics)
    assert len(topics) == 30
    assert topics[:3] == ["new a", "new b", "topic 0"]
    assert "topic 28" not in topics and "topic 29" not in topics
    decisions = list(resp.profile.past_decisions)
    assert len(decisions) == 20 and decisions[0] == "decision new" and "decision 19" not in decisions


async def test_too_many_items_or_too_long_an_item_is_refused_never_trimmed(profiles):
    app, stub = profiles
    ok = await upsert(stub, sensitivities=["s" * 500])
    assert len(ok.profile.sensitivities[0]) == 500
    code, info, bad = await refused(upsert(stub, topics=["fine", "t" * 501]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.domain) == ("FIELD_TOO_LONG", "profiles.agentlearn.dev")
    assert info.metadata["limit"] == "500" and info.metadata["length"] == "501"
    assert bad.field_violations[0].field == "topics[1]"
    code, info, bad = await refused(upsert(stub, past_decisions=[f"d{i}" for i in range(21)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "TOO_MANY_ITEMS"
    assert bad.field_violations[0].field == "past_decisions" and info.metadata["limit"] == "20"
    stored = (await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=[BOB]))).profiles
    assert stored[0].observation_count == 1 and list(stored[0].topics) == []
    assert await rows(app) == 1


async def test_a_retried_pass_of_the_same_turn_is_not_counted_twice(profiles):
    app, stub = profiles
    await upsert(stub, turn_id="run-1", topics=["billing"])
    again = await upsert(stub, turn_id="run-1", topics=["billing", "something else"])
    assert not again.created
    assert again.profile.observation_count == 1 and list(again.profile.topics) == ["billing"]
    assert len(await read_events(app.infra.pool, "counterparty_profile_updated")) == 1
    assert (await upsert(stub, turn_id="run-2", topics=["pricing"])).profile.observation_count == 2


def test_merge_rule_is_case_and_whitespace_insensitive_newest_first_and_bounded():
    assert item_key("  Foo\t  BAR ") == item_key("foo bar")
    assert merge_list(["b", "A "], ["a", "c", "d"], 3) == ("b", "A ", "c")
    assert merge_list(["x", "X"], [], 5) == ("x",)


# ------------------------------------------------------------------------------------ concurrency


async def test_concurrent_observations_of_one_subject_all_land(profiles):
    app, stub = profiles
    results = await asyncio.gather(
        *(upsert(stub, turn_id=f"run-{i}", topics=[f"topic {i}"], past_decisions=[f"decision {i}"]) for i in range(20))
    )
    assert sum(r.created for r in results) == 1
    [profile] = (await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=[BOB]))).profiles
    assert profile.observation_count == 20
    assert sorted(profile.topics) == sorted(f"topic {i}" for i in range(20))
    assert len(profile.past_decisions) == 20
    assert await rows(app) == 1
    assert len(await read_events(app.infra.pool, "counterparty_profile_updated")) == 20


async def test_concurrent_observations_past_the_bound_keep_the_bound(profiles):
    _, stub = profiles
    await asyncio.gather(*(upsert(stub, turn_id=f"run-{i}", topics=[f"topic {i}"]) for i in range(40)))
    [profile] = (await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=[BOB]))).profiles
    assert profile.observation_count == 40
    assert len(set(profile.topics)) == 30


async def test_a_first_observation_that_loses_the_creation_race_merges_into_the_winner(profiles, clock):
    app, stub = profiles
    winner = await asyncpg.connect(app.infra.dsn)
    try:
        tx = winner.transaction()
        await tx.start()
        await winner.execute(
            """INSERT INTO counterparty_profiles (id, company, observer, platform, subject_key, subject_handle,
                                                  topics, observation_count, create_time, update_time, last_turn_id)
               VALUES (gen_random_uuid(), 'acme', 'ana', 'slack', 'bob', 'bob', ARRAY['winner'], 1, $1, $1, 'run-w')""",
            clock.now(),
        )
        # The upsert sees no row, and its insert waits on the winner's uncommitted one.
        call = asyncio.ensure_future(upsert(stub, turn_id="run-l", topics=["loser"]))
        for _ in range(600):
            waiting = await winner.fetchval(
                """SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'"""
            )
            if waiting or call.done():
                break
            await asyncio.sleep(0.05)
        assert waiting == 1
        await tx.commit()
        resp = await call
    finally:
        await winner.close()
    assert not resp.created
    assert resp.profile.observation_count == 2 and list(resp.profile.topics) == ["loser", "winner"]
    assert resp.profile.last_turn_id == "run-l"
    assert await rows(app) == 1


# ---------------------------------------------------------------------------------------- privacy


async def test_a_profile_is_private_to_its_observer(profiles):
    app, stub = profiles
    await upsert(stub, observer="ana", topics=["billing"])
    await upsert(stub, observer="carl", topics=["hiring"], communication_style="Chatty.")
    assert await rows(app) == 2  # the same subject seen by two observers: two profiles, never merged
    ana = (await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=[BOB]))).profiles
    carl = (await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="carl", subjects=[BOB]))).profiles
    assert list(ana[0].topics) == ["billing"] and ana[0].communication_style == ""
    assert list(carl[0].topics) == ["hiring"] and ana[0].id != carl[0].id
    for observer, company in (("dora", "acme"), ("ana", "globex")):
        got = await stub.GetProfiles(pb.GetProfilesRequest(company=company, observer=observer, subjects=[BOB]))
        assert list(got.profiles) == []
        listed = await stub.ListProfiles(pb.ListProfilesRequest(company=company, observer=observer))
        assert list(listed.profiles) == [] and listed.total_size == 0


@pytest.mark.parametrize(
    ("subject", "field"),
    [
        (pb.Subject(handle="ana", platform="slack"), "subject.handle"),
        (pb.Subject(handle="ANA", platform="github"), "subject.handle"),
        (pb.Subject(handle="ana", external_id="U123", platform="jira"), "subject.handle"),
        (pb.Subject(external_id="ana", platform="email"), "subject.external_id"),
    ],
)
async def test_the_observer_never_profiles_itself(profiles, subject, field):
    app, stub = profiles
    code, info, bad = await refused(upsert(stub, subject=subject, topics=["self"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.domain) == ("SELF_PROFILE", "profiles.agentlearn.dev")
    assert bad.field_violations[0].field == field
    assert await rows(app) == 0
    assert await read_events(app.infra.pool, "counterparty_profile_updated") == []


# ------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("request_kwargs", "field", "reason"),
    [
        ({"subject": pb.Subject(handle="bob")}, "subject.platform", "FIELD_REQUIRED"),
        ({"subject": None}, "subject", "FIELD_REQUIRED"),  # the contract: subject is required
        ({"subject": pb.Subject(platform="slack")}, "subject.handle", "FIELD_REQUIRED"),
        ({"subject": pb.Subject(handle="bob", platform="   ")}, "subject.platform", "FIELD_REQUIRED"),
        ({"subject": pb.Subject(handle="bob", platform="p" * 65)}, "subject.platform", "FIELD_TOO_LONG"),
        ({"subject": pb.Subject(handle="  ", platform="slack")}, "subject.handle", "FIELD_REQUIRED"),
        ({"subject": pb.Subject(external_id="x" * 201, platform="slack")}, "subject.external_id", "FIELD_TOO_LONG"),
        ({"company": ""}, "company", "FIELD_REQUIRED"),
        ({"company": "bad handle!"}, "company", "FIELD_INVALID"),
        ({"observer": ""}, "observer", "FIELD_REQUIRED"),
        ({"topics": ["ok", "   "]}, "topics[1]", "FIELD_REQUIRED"),
        ({"sensitivities": [""]}, "sensitivities[0]", "FIELD_REQUIRED"),
        ({"topics": [f"t{i}" for i in range(31)]}, "topics", "TOO_MANY_ITEMS"),
        ({"communication_style": "s" * 1001}, "communication_style", "FIELD_TOO_LONG"),
        ({"turn_id": "r" * 201}, "turn_id", "FIELD_TOO_LONG"),
        ({"request_id": "k" * 1101}, "request_id", "FIELD_TOO_LONG"),
        ({"topics": []}, "communication_style", "OBSERVATION_EMPTY"),
    ],
)
async def test_bad_upserts_are_invalid_argument_naming_the_field(profiles, request_kwargs, field, reason):
    app, stub = profiles
    req = {"company": "acme", "observer": "ana", "subject": BOB, "topics": ["billing"], **request_kwargs}
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.UpsertProfile(pb.UpsertProfileRequest(**req))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.domain) == (reason, "profiles.agentlearn.dev")
    assert bad.field_violations[0].field == field
    assert await rows(app) == 0


async def test_platform_is_case_insensitive_and_handle_and_external_id_are_both_kept(profiles):
    app, stub = profiles
    await upsert(stub, subject=pb.Subject(handle="bob", platform="Slack"), topics=["a"])
    resp = await upsert(stub, subject=pb.Subject(handle="bob", external_id="U042", platform="slack"), topics=["b"])
    assert resp.profile.subject == pb.Subject(handle="bob", external_id="U042", platform="slack")
    assert resp.profile.observation_count == 2 and await rows(app) == 1
    # An external person with no handle is filed under the external id.
    ext = await upsert(stub, subject=pb.Subject(external_id="eve@example.com", platform="email"), topics=["x"])
    assert ext.created and ext.profile.subject.handle == ""
    row = await app.infra.pool.fetchrow(
        "SELECT subject_key, subject_handle, subject_external_id FROM counterparty_profiles WHERE id = $1::uuid",
        ext.profile.id,
    )
    assert tuple(row) == ("eve@example.com", None, "eve@example.com")


async def test_any_sender_a_turn_may_carry_is_a_subject(profiles):
    """A subject is named as a turn's sender is (no pattern): a platform written "MS Teams" or with
    "/" and ":" in it, a handle with a space, a one-letter login. The platform is filed folded."""
    app, stub = profiles
    for handle, platform in (("bob smith", "MS Teams"), ("q", "github"), ("dana", "Lab:Chat/EU")):
        resp = await upsert(stub, subject=pb.Subject(handle=handle, platform=platform), topics=["billing"])
        assert resp.created and resp.profile.subject == pb.Subject(handle=handle, platform=platform.casefold())
    again = await upsert(stub, subject=pb.Subject(handle="bob smith", platform="ms teams"), topics=["euros"])
    assert not again.created and again.profile.observation_count == 2 and await rows(app) == 3


U042 = pb.Subject(external_id="U042", platform="slack")
BOB_U042 = pb.Subject(handle="bob", external_id="U042", platform="slack")


async def get(stub, *subjects):  # type: ignore[no-untyped-def]
    return list(
        (await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=subjects))).profiles
    )


async def test_a_person_first_seen_by_external_id_keeps_one_profile_once_the_handle_is_known(profiles, clock):
    app, stub = profiles
    first = await upsert(stub, subject=U042, topics=["latency"], turn_id="run-1")
    clock.advance(minutes=1)
    both = await upsert(stub, subject=BOB_U042, topics=["budgets"], turn_id="run-2")
    clock.advance(minutes=1)
    by_handle = await upsert(stub, subject=BOB, topics=["hiring"], turn_id="run-3")
    assert first.created and not both.created and not by_handle.created
    assert first.profile.id == both.profile.id == by_handle.profile.id
    assert by_handle.profile.subject == BOB_U042 and by_handle.profile.observation_count == 3
    assert list(by_handle.profile.topics) == ["hiring", "budgets", "latency"]
    # Filed under the external id it was first seen by; it learned the handle.
    row = await app.infra.pool.fetchrow(
        "SELECT subject_key, subject_handle, subject_external_id FROM counterparty_profiles"
    )
    assert tuple(row) == ("U042", "bob", "U042") and await rows(app) == 1
    for asked in ([BOB], [U042], [BOB_U042], [BOB, U042]):
        assert [p.id for p in await get(stub, *asked)] == [first.profile.id], asked
    # And the other way round: a handle first, then an external id alone finds it once learned.
    await upsert(stub, subject=pb.Subject(handle="cara", platform="slack"), topics=["a"])
    await upsert(stub, subject=pb.Subject(handle="cara", external_id="U077", platform="slack"), topics=["b"])
    alone = await upsert(stub, subject=pb.Subject(external_id="U077", platform="Slack"), topics=["c"])
    assert not alone.created and alone.profile.subject.handle == "cara" and await rows(app) == 2


async def test_a_first_observation_racing_one_with_another_identifier_set_makes_one_row(profiles, clock):
    """While a first observation by external id is between its read and its commit, a second one
    naming the handle and that external id waits for it (it would otherwise find no row, and file
    a second one under the handle)."""
    app, stub = profiles

    async def waiting(conn: asyncpg.Connection, want: int, *calls: asyncio.Future) -> int:  # type: ignore[type-arg]
        for _ in range(600):
            n = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            await conn.execute("SELECT pg_stat_clear_snapshot()")  # the view is read once per transaction
            if n >= want or any(c.done() for c in calls):
                return int(n)
            await asyncio.sleep(0.05)
        return int(n)

    blocker = await asyncpg.connect(app.infra.dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        # A row under U042 not yet committed (a writer without the locks): the first upsert's
        # insert waits on it, holding the identifier lock of U042.
        await blocker.execute(
            """INSERT INTO counterparty_profiles (id, company, observer, platform, subject_key, subject_external_id,
                                                  topics, observation_count, create_time, update_time)
               VALUES (gen_random_uuid(), 'acme', 'ana', 'slack', 'U042', 'U042', ARRAY['first'], 1, $1, $1)""",
            clock.now(),
        )
        by_external = asyncio.ensure_future(upsert(stub, subject=U042, topics=["by external id"], turn_id="run-1"))
        assert await waiting(blocker, 1, by_external) == 1
        by_both = asyncio.ensure_future(upsert(stub, subject=BOB_U042, topics=["by both"], turn_id="run-2"))
        assert await waiting(blocker, 2, by_external, by_both) == 2
        await tx.commit()
        await asyncio.gather(by_external, by_both)
    finally:
        await blocker.close()
    assert await rows(app) == 1
    [profile] = await get(stub, BOB)
    assert profile.observation_count == 3 and profile.subject == BOB_U042
    assert sorted(profile.topics) == ["by both", "by external id", "first"]


async def test_two_rows_of_one_person_written_before_the_fix_read_as_one_and_fold_on_the_next_upsert(profiles, clock):
    """Rows filed under the external id and under the handle (what an upsert wrote before it found
    a row by either identifier): a read combines them, the next upsert naming the person folds
    them into the first created, observations and all."""
    app, stub = profiles
    old = await upsert(stub, subject=U042, topics=["latency"], communication_style="Terse.", turn_id="run-1")
    clock.advance(minutes=1)
    await app.infra.pool.execute(
        """INSERT INTO counterparty_profiles (id, company, observer, platform, subject_key, subject_handle,
                                              subject_external_id, topics, past_decisions, observation_count,
                                              create_time, update_time, last_turn_id)
           VALUES (gen_random_uuid(), 'acme', 'ana', 'slack', 'bob', 'bob', 'U042', ARRAY['budgets', 'LATENCY'],
                   ARRAY['Chose Postgres'], 2, $1, $1, 'run-2')""",
        clock.now(),
    )
    [read] = await get(stub, BOB_U042)
    assert read.id == old.profile.id and read.subject == BOB_U042
    assert list(read.topics) == ["budgets", "LATENCY"] and list(read.past_decisions) == ["Chose Postgres"]
    assert read.communication_style == "Terse." and read.observation_count == 3 and read.last_turn_id == "run-2"
    assert [p.id for p in await get(stub, BOB, U042)] == [old.profile.id]  # one person, answered once
    clock.advance(minutes=1)
    resp = await upsert(stub, subject=BOB, topics=["hiring"], turn_id="run-3")
    assert resp.profile.id == old.profile.id and await rows(app) == 1
    assert list(resp.profile.topics) == ["hiring", "budgets", "LATENCY"] and resp.profile.observation_count == 4
    trace = await stub.GetProfileProvenance(
        pb.GetProfileProvenanceRequest(company="acme", observer="ana", profile_id=old.profile.id)
    )
    assert len(trace.observations) == 2  # the first row's observation moved with it, and the new one


async def pre_fix_row(app, key: str, handle: str, external_id: str, topic: str, at) -> str:  # type: ignore[no-untyped-def]
    """A row of ana's as an upsert wrote one before it found a row by either identifier."""
    return str(
        await app.infra.pool.fetchval(
            """INSERT INTO counterparty_profiles (id, company, observer, platform, subject_key, subject_handle,
                                                  subject_external_id, topics, observation_count, create_time,
                                                  update_time, last_turn_id)
               VALUES (gen_random_uuid(), 'acme', 'ana', 'slack', $1, $2, $3, ARRAY[$4::text], 1, $5, $5, NULL)
               RETURNING id""",
            key,
            handle,
            external_id,
            topic,
            at,
        )
    )


async def listed(stub, size: int) -> tuple[list[list[pb.Profile]], set[int]]:  # type: ignore[no-untyped-def]
    """Every page of ana's profiles at ``size``, and the total_size each page said."""
    pages, totals, token = [], set(), ""
    while True:
        page = await stub.ListProfiles(
            pb.ListProfilesRequest(company="acme", observer="ana", page_size=size, page_token=token)
        )
        pages.append(list(page.profiles))
        totals.add(page.total_size)
        token = page.next_page_token
        if not token:
            return pages, totals


async def provenance(stub, profile_id: str) -> pb.GetProfileProvenanceResponse:  # type: ignore[no-untyped-def]
    return await stub.GetProfileProvenance(
        pb.GetProfileProvenanceRequest(company="acme", observer="ana", profile_id=profile_id)
    )


async def test_a_person_with_two_rows_written_before_the_fix_is_listed_once_merged_and_paged_stably(profiles, clock):
    """ListProfiles listed both rows (and counted two people) until an upsert folded them: it lists
    the person once, merged as GetProfiles answers them, at the newer row's place, so every page
    size shows each person exactly once."""
    app, stub = profiles
    old = await upsert(stub, subject=U042, topics=["latency"], turn_id="run-1")
    for name in ("eve", "cara"):
        clock.advance(minutes=1)
        await upsert(stub, subject=pb.Subject(handle=name, platform="slack"), topics=[f"about {name}"])
    clock.advance(minutes=1)
    await pre_fix_row(app, "bob", "bob", "U042", "budgets", clock.now())  # bob's second row, newer than cara's
    clock.advance(minutes=1)
    await upsert(stub, subject=pb.Subject(handle="dave", platform="slack"), topics=["about dave"])
    assert await rows(app) == 5
    [merged] = await get(stub, BOB_U042)
    assert merged.id == old.profile.id and list(merged.topics) == ["budgets", "latency"]
    for size in (1, 2, 3, 50):
        pages, totals = await listed(stub, size)
        assert totals == {4} and all(0 < len(p) <= size for p in pages), size
        people = [p for page in pages for p in page]
        assert [p.subject.handle or p.subject.external_id for p in people] == ["dave", "bob", "cara", "eve"], size
        assert people[1] == merged, size  # as the point read answers the person
    clock.advance(minutes=1)
    await upsert(stub, subject=BOB, topics=["hiring"], turn_id="run-3")  # folds the two rows
    assert await rows(app) == 4
    pages, totals = await listed(stub, 2)
    assert totals == {4} and [p.subject.handle for page in pages for p in page] == ["bob", "dave", "cara", "eve"]


async def test_the_provenance_of_a_row_folded_away_is_the_persons_it_went_into(profiles, clock):
    """GetProfileProvenance of a row an upsert folded into the person's first row answered
    NOT_FOUND (a caller who held its id lost the provenance): it answers the row it went into, as
    often as the folding goes on; and a row of a person whose rows are not folded yet answers the
    person's, as every read answers the person."""
    app, stub = profiles
    clock.advance(minutes=1)
    old = await upsert(stub, subject=U042, topics=["latency"], turn_id="run-1")
    clock.advance(minutes=1)
    second = await pre_fix_row(app, "bob", "bob", "U042", "budgets", clock.now())
    before = await provenance(stub, second)
    assert before == await provenance(stub, old.profile.id)
    assert [(e.text, list(e.turn_ids)) for e in before.entries] == [("budgets", []), ("latency", ["run-1"])]
    clock.advance(minutes=1)
    await upsert(stub, subject=BOB, topics=["hiring"], turn_id="run-2")  # the second row goes into the first
    assert await rows(app) == 1
    after = await provenance(stub, second)
    assert after == await provenance(stub, old.profile.id)
    assert [o.provenance.turn_ids[0] for o in after.observations] == ["run-2", "run-1"]
    assert [e.text for e in after.entries] == ["hiring", "budgets", "latency"]
    # A still older row of bob's (filed under another external id) takes them both on the next upsert.
    oldest = await pre_fix_row(app, "U999", "bob", "U999", "kafka", clock.now() - timedelta(days=1))
    clock.advance(minutes=1)
    await upsert(stub, subject=BOB, topics=["pricing"], turn_id="run-3")
    assert await rows(app) == 1
    for held in (second, old.profile.id, oldest):
        answer = await provenance(stub, held)
        assert answer == await provenance(stub, oldest), held
        assert [o.provenance.turn_ids[0] for o in answer.observations] == ["run-3", "run-2", "run-1"]
    # Another observer's, as before: not found, whichever id it is asked by.
    for held in (second, oldest):
        code, info, _ = await refused(
            stub.GetProfileProvenance(pb.GetProfileProvenanceRequest(company="acme", observer="carl", profile_id=held))
        )
        assert (code, info.reason) == (grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND")


# ------------------------------------------------------------------------------------------ reads


async def test_get_profiles_answers_in_the_order_asked_skipping_absent_ones(profiles, clock):
    _, stub = profiles
    cara = pb.Subject(handle="cara", platform="github")
    eve = pb.Subject(external_id="eve@example.com", platform="email")
    for subject in (BOB, cara, eve):
        await upsert(stub, subject=subject, topics=[f"about {subject.handle or subject.external_id}"])
        clock.advance(minutes=1)
    asked = [
        eve,
        pb.Subject(handle="nobody", platform="slack"),
        pb.Subject(handle="bob", platform="github"),  # bob, but not on github
        BOB,
        cara,
        BOB,  # asked twice, answered once
        pb.Subject(handle="ana", platform="slack"),  # the observer itself: never a profile
    ]
    got = await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=asked))
    assert [(p.subject.handle, p.subject.external_id, p.subject.platform) for p in got.profiles] == [
        ("", "eve@example.com", "email"),
        ("bob", "", "slack"),
        ("cara", "", "github"),
    ]
    assert list((await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana"))).profiles) == []


async def test_get_profiles_refuses_more_than_fifty_subjects_and_bad_subjects(profiles):
    _, stub = profiles
    fifty = [pb.Subject(handle=f"h{i}", platform="slack") for i in range(50)]
    assert (
        list((await stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=fifty))).profiles)
        == []
    )
    code, info, bad = await refused(
        stub.GetProfiles(
            pb.GetProfilesRequest(
                company="acme", observer="ana", subjects=[*fifty, pb.Subject(handle="x", platform="slack")]
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "TOO_MANY_SUBJECTS"
    assert bad.field_violations[0].field == "subjects" and info.metadata["limit"] == "50"
    code, info, bad = await refused(
        stub.GetProfiles(pb.GetProfilesRequest(company="acme", observer="ana", subjects=[BOB, pb.Subject(handle="x")]))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_REQUIRED"
    assert bad.field_violations[0].field == "subjects[1].platform"
    code, info, bad = await refused(stub.GetProfiles(pb.GetProfilesRequest(company="acme", subjects=[BOB])))
    assert bad.field_violations[0].field == "observer"


async def test_list_pages_most_recently_updated_first_with_total_size(profiles, clock):
    _, stub = profiles
    subjects = [pb.Subject(handle=f"person{i}", platform="slack") for i in range(7)]
    for subject in subjects:
        await upsert(stub, subject=subject, topics=["x"])
        clock.advance(minutes=1)
    await upsert(stub, subject=subjects[2], topics=["y"])  # updated last: first in the list
    await upsert(stub, observer="carl", subject=subjects[0], topics=["z"])  # another observer's
    seen, token = [], ""
    while True:
        page = await stub.ListProfiles(
            pb.ListProfilesRequest(company="acme", observer="ana", page_size=3, page_token=token)
        )
        assert page.total_size == 7 and len(page.profiles) <= 3
        seen += [p.subject.handle for p in page.profiles]
        token = page.next_page_token
        if not token:
            break
    assert seen == ["person2", "person6", "person5", "person4", "person3", "person1", "person0"]
    everything = await stub.ListProfiles(pb.ListProfilesRequest(company="acme", observer="ana"))
    assert len(everything.profiles) == 7 and everything.next_page_token == ""


async def test_page_tokens_and_sizes_are_checked(profiles):
    _, stub = profiles
    for i in range(3):
        await upsert(stub, subject=pb.Subject(handle=f"p{i}", platform="slack"), topics=["x"])
    page = await stub.ListProfiles(pb.ListProfilesRequest(company="acme", observer="ana", page_size=1))
    assert page.next_page_token
    for bad_request in (
        pb.ListProfilesRequest(company="acme", observer="ana", page_token="garbage"),
        pb.ListProfilesRequest(company="acme", observer="carl", page_token=page.next_page_token),  # other filters
        pb.ListProfilesRequest(company="globex", observer="ana", page_token=page.next_page_token),
        pb.ListProfilesRequest(company="acme", observer="ana", page_size=-1),
    ):
        code, info, bad = await refused(stub.ListProfiles(bad_request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.reason in {"PAGE_TOKEN_INVALID", "PAGE_SIZE_INVALID"}
        assert bad.field_violations[0].field in {"page_token", "page_size"}
    following = await stub.ListProfiles(
        pb.ListProfilesRequest(company="acme", observer="ana", page_size=1, page_token=page.next_page_token)
    )
    assert following.profiles[0].id != page.profiles[0].id


# ----------------------------------------------------------------------------------------- events


async def test_each_merged_observation_is_an_event(profiles):
    app, stub = profiles
    await upsert(stub, turn_id="run-1", topics=["billing"])
    await upsert(
        stub, turn_id="run-2", subject=pb.Subject(handle="bob", external_id="U042", platform="slack"), topics=["x"]
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await upsert(stub, subject=pb.Subject(handle="ana", platform="slack"), topics=["self"])
    events = await read_events(app.infra.pool, "counterparty_profile_updated")
    assert [(e["company"], e["seat"], e["turn_id"]) for e in events] == [
        ("acme", "ana", "run-1"),
        ("acme", "ana", "run-2"),
    ]
    first, second = (e["payload"] for e in events)
    assert first["created"] is True and second["created"] is False
    assert first["subject"] == {"handle": "bob", "external_id": None, "platform": "slack"}
    assert second["subject"] == {"handle": "bob", "external_id": "U042", "platform": "slack"}
    assert second["observation_count"] == 2 and first["profile_id"] == second["profile_id"]


async def test_a_retried_request_id_merges_nothing_twice(make_settings, dsn, clock, edge_index):
    from agentlearn.profiles.v1 import profile_service_pb2 as ppb
    from agentlearn.profiles.v1 import profile_service_pb2_grpc as pgrpc
    from tests.support.app import open_app

    async with open_app(make_settings(), dsn, names=["profiles"], clock=clock, embedder=None, index=edge_index) as app:
        stub = pgrpc.ProfileServiceStub(app.channel)
        subject = ppb.Subject(handle="bob", platform="slack")

        def observe(topic: str, turn: str, key: str) -> ppb.UpsertProfileRequest:
            return ppb.UpsertProfileRequest(
                company="acme", observer="ana", subject=subject, topics=[topic], turn_id=turn, request_id=key
            )

        await stub.UpsertProfile(observe("kafka", "t1", "t1:profiler:slack/bob"))
        await stub.UpsertProfile(observe("billing", "t2", "t2:profiler:slack/bob"))
        again = await stub.UpsertProfile(observe("kafka", "t1", "t1:profiler:slack/bob"))  # t1 redone
        assert not again.created
        assert again.profile.observation_count == 2
        assert list(again.profile.topics) == ["billing", "kafka"]


@pytest.mark.parametrize(
    ("key", "ids", "platform", "hers"),
    [
        ("w:profiler:github/q", ["q"], "github", True),
        ("w:profiler:github/q", ["q"], "", True),  # every platform
        ("w:profiler:github/q", ["q"], "ms teams", False),  # another person
        ("w:profiler:github/qa", ["q"], "", False),
        ("w:profiler:MS Teams/dana", ["dana"], "ms teams", True),
        ("w:profiler:Lab%3AChat%2FEU/bob", ["bob"], "lab:chat/eu", True),
        ("w:profiler:Lab%3AChat%2FEU/bob", ["EU/bob", "bob"], "eu", False),
        ("w:profiler:slack/a%3Ab%2Fc", ["a:b/c"], "slack", True),
        ("w:profiler:slack/a%3Ab%2Fc", ["c", "b/c"], "", False),
        ("w:profiler:slack/a:b", ["a:b"], "slack", True),  # written before identifiers were escaped
        ("w:profiler:slack/a:b", ["b"], "", False),
        ("w:diary:slack/q", ["q"], "", False),  # not the profiler's
    ],
)
def test_a_profiler_key_names_exactly_its_sender(key, ids, platform, hers):
    """An erasure reads the profiler's idempotency keys by their structure (the escaped
    ``<platform>/<identifier>`` after ``:profiler:``), never as words: any length, no other person."""
    from services.profiles.erasure import _names_her

    assert _names_her(key, ids, platform) is hers
