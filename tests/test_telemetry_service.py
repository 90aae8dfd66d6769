"""The telemetry service over real gRPC on real Postgres: hit rates per block per UTC day and spend
per purpose per day aggregated from the event log, the seats of a company with their activity, the
paged event listing, the windows it refuses, and who may ask.

Events are written by the real writer every service uses (``PostgresEventLog`` at a moved
``ManualClock``), and once end to end: a real ``BuildTurnContext`` records its prefetch_summary
and the auxiliary calls it made, and the telemetry reads them back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import json_format

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.telemetry.v1 import telemetry_service_pb2 as pb
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as pb_grpc
from libs.common.clock import ManualClock
from libs.common.events import read_events
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.turns import ts

START = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)
NOW = START + timedelta(days=3)
"""Where each test leaves the clock once it has written its events: an unset end_time is now."""


def summary(*blocks: tuple[str, bool]) -> dict:
    """A prefetch_summary payload as the prefetch writes it (the fields the reader uses)."""
    return {"blocks": [{"block": b, "hit": hit, "bytes": 10 if hit else 0} for b, hit in blocks]}


async def refused(call) -> tuple:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return error_info(err.value)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
async def app(make_settings, dsn, clock, edge_index):
    async with open_app(make_settings(), dsn, names=["telemetry"], clock=clock, embedder=None, index=edge_index) as a:
        yield a


@pytest.fixture
def stub(app) -> pb_grpc.TelemetryServiceStub:
    return pb_grpc.TelemetryServiceStub(app.channel)


async def emit_at(app, clock: ManualClock, when: datetime, kind: str, **kw) -> None:  # type: ignore[no-untyped-def]
    """An event recorded at ``when`` by the writer every service uses."""
    clock.set(when)
    await app.infra.events.emit_strict(kind, **kw)


async def test_hit_rates_count_turns_and_hits_per_block_per_utc_day_for_the_seat_asked(app, clock, stub):
    day1, day2 = START, datetime(2026, 3, 11, tzinfo=UTC)  # day2: midnight UTC
    # A summary whose blocks another version wrote differently reads as no blocks, never an error.
    await emit_at(app, clock, day1, "prefetch_summary", company="acme", seat="ana", blocks="skills")

    async def anas(when: datetime, *blocks: tuple[str, bool]) -> None:
        await emit_at(app, clock, when, "prefetch_summary", company="acme", seat="ana", **summary(*blocks))

    await anas(
        day1 + timedelta(hours=1),
        ("skills", True),
        ("personal_memory", False),
        ("counterparty", True),
        ("counterparty", False),
    )
    await anas(day1 + timedelta(hours=2), ("skills", False), ("personal_memory", True))
    await anas(day2 + timedelta(hours=23, minutes=59), ("skills", True))
    # Another seat, another company, another kind: not ana's.
    await emit_at(app, clock, day1, "prefetch_summary", company="acme", seat="bo", **summary(("skills", True)))
    await emit_at(app, clock, day1, "prefetch_summary", company="globex", seat="ana", **summary(("skills", True)))
    await emit_at(app, clock, day1, "turn_completed", company="acme", seat="ana", blocks=[{"block": "skills"}])
    clock.set(NOW)

    resp = await stub.GetPrefetchHitRates(
        pb.GetPrefetchHitRatesRequest(company="acme", seat="ana", start_time=ts(START - timedelta(days=1)))
    )
    got = {
        (d.day_start_time.ToDatetime(tzinfo=UTC).date().isoformat(), d.block): (d.turn_count, d.hit_count)
        for d in resp.days
    }
    assert got == {
        ("2026-03-10", "counterparty"): (1, 1),  # two counterparty blocks in one turn: one turn, a hit
        ("2026-03-10", "personal_memory"): (2, 1),
        ("2026-03-10", "skills"): (2, 1),
        ("2026-03-11", "skills"): (1, 1),
    }
    assert {t.block: (t.turn_count, t.hit_count, round(t.hit_rate, 3)) for t in resp.totals} == {
        "counterparty": (1, 1, 1.0),
        "personal_memory": (2, 1, 0.5),
        "skills": (3, 2, 0.667),
    }
    assert resp.end_time.ToDatetime(tzinfo=UTC) == clock.now()
    # The whole company: bo's turn counts too; globex's never does.
    company = await stub.GetPrefetchHitRates(
        pb.GetPrefetchHitRatesRequest(company="acme", start_time=ts(START - timedelta(days=1)))
    )
    assert {t.block: t.turn_count for t in company.totals}["skills"] == 4


async def test_auxiliary_spend_sums_tokens_per_purpose_per_day_most_tokens_first(app, clock, stub):
    spend = {"stage": "post_turn", "provider": "p", "model": "m"}
    calls: list[tuple[datetime, str, str, object, object]] = [
        (START, "ana", "persist_decider", 100, 20),
        (START + timedelta(hours=1), "ana", "persist_decider", 50, 5),
        (START + timedelta(days=1), "ana", "session_review", 900, 300),
        # A payload another version wrote differently reads as no tokens, never as an error.
        (START + timedelta(days=1), "ana", "session_review", "many", None),
        (START, "bo", "persist_decider", 7, 7),
    ]
    for when, seat, purpose, prompt_tokens, completion_tokens in calls:
        await emit_at(
            app,
            clock,
            when,
            "auxiliary_spend",
            company="acme",
            seat=seat,
            purpose=purpose,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            **spend,
        )
    clock.set(NOW)

    resp = await stub.GetAuxiliarySpend(
        pb.GetAuxiliarySpendRequest(company="acme", seat="ana", start_time=ts(START - timedelta(days=2)))
    )
    days = {
        (d.day_start_time.ToDatetime(tzinfo=UTC).day, d.purpose): (d.call_count, d.prompt_tokens, d.completion_tokens)
        for d in resp.days
    }
    assert days == {(10, "persist_decider"): (2, 150, 25), (11, "session_review"): (2, 900, 300)}
    assert [(t.purpose, t.call_count, t.prompt_tokens + t.completion_tokens) for t in resp.totals] == [
        ("session_review", 2, 1200),
        ("persist_decider", 2, 175),
    ]
    # A window that ends before the second day leaves it out.
    early = await stub.GetAuxiliarySpend(
        pb.GetAuxiliarySpendRequest(
            company="acme",
            seat="ana",
            start_time=ts(START - timedelta(days=2)),
            end_time=ts(START + timedelta(hours=20)),
        )
    )
    assert [t.purpose for t in early.totals] == ["persist_decider"]


async def test_seat_activity_lists_every_seat_by_handle_with_the_windows_counts_paged_and_searchable(app, clock, stub):
    old = START - timedelta(days=90)
    await emit_at(app, clock, old, "turn_completed", company="acme", seat="zed")  # quiet for 90 days: still listed
    for seat in ("ana", "anabel", "bo"):
        await emit_at(app, clock, START, "turn_completed", company="acme", seat=seat)
        await emit_at(app, clock, START, "prefetch_summary", company="acme", seat=seat, **summary(("skills", True)))
    await emit_at(
        app,
        clock,
        START,
        "auxiliary_spend",
        company="acme",
        seat="ana",
        purpose="x",
        prompt_tokens=30,
        completion_tokens=12,
    )
    await emit_at(app, clock, START, "turn_completed", company="globex", seat="carl")
    await emit_at(app, clock, START, "diary_sweep_completed", company="acme")  # no seat: not a seat
    clock.set(NOW)

    first = await stub.ListSeatActivity(pb.ListSeatActivityRequest(company="acme", page_size=2))
    assert [s.seat for s in first.seats] == ["ana", "anabel"] and first.total_size == 4 and first.next_page_token
    second = await stub.ListSeatActivity(
        pb.ListSeatActivityRequest(company="acme", page_size=2, page_token=first.next_page_token)
    )
    assert [s.seat for s in second.seats] == ["bo", "zed"] and not second.next_page_token
    ana = first.seats[0]
    assert (ana.turn_count, ana.prefetch_count, ana.auxiliary_call_count, ana.auxiliary_tokens, ana.event_count) == (
        1,
        1,
        1,
        42,
        3,
    )
    zed = second.seats[1]
    assert zed.event_count == 0 and zed.last_event_time.ToDatetime(tzinfo=UTC) == old

    found = await stub.ListSeatActivity(pb.ListSeatActivityRequest(company="acme", query="ANA"))
    assert [s.seat for s in found.seats] == ["ana", "anabel"] and found.total_size == 2
    # A token is bound to the filters it was minted for.
    code, info, _ = await refused(
        stub.ListSeatActivity(pb.ListSeatActivityRequest(company="acme", query="b", page_token=first.next_page_token))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "PAGE_TOKEN_INVALID"


async def test_events_page_newest_first_filtered_by_seat_kind_and_turn_with_their_payload(app, clock, stub):
    for i in range(5):
        await emit_at(
            app,
            clock,
            START + timedelta(minutes=i),
            "skill_refined",
            company="acme",
            seat="ana",
            turn_id=f"t{i}",
            skill_id=f"s{i}",
            version=i + 1,
        )
    await emit_at(app, clock, START + timedelta(minutes=9), "skill_archived", company="acme", seat="ana", skill_id="s0")
    await emit_at(app, clock, START + timedelta(minutes=9), "skill_refined", company="acme", seat="bo", turn_id="t9")
    await emit_at(app, clock, START + timedelta(minutes=9), "skill_refined", company="globex", seat="ana")

    seen: list[str] = []
    token = ""
    while True:
        page = await stub.ListEvents(
            pb.ListEventsRequest(company="acme", seat="ana", kinds=["skill_refined"], page_size=2, page_token=token)
        )
        seen += [e.turn_id for e in page.events]
        token = page.next_page_token
        if not token:
            break
    assert seen == ["t4", "t3", "t2", "t1", "t0"]
    (one,) = (await stub.ListEvents(pb.ListEventsRequest(company="acme", turn_id="t2"))).events
    assert one.kind == "skill_refined" and one.seat == "ana"
    assert json_format.MessageToDict(one.payload) == {"skill_id": "s2", "version": 3}
    every = await stub.ListEvents(pb.ListEventsRequest(company="acme"))
    assert len(every.events) == 7 and every.events[0].time.ToDatetime(tzinfo=UTC) == START + timedelta(minutes=9)
    window = await stub.ListEvents(
        pb.ListEventsRequest(
            company="acme",
            seat="ana",
            start_time=ts(START + timedelta(minutes=1)),
            end_time=ts(START + timedelta(minutes=3)),
        )
    )
    assert [e.turn_id for e in window.events] == ["t2", "t1"]


async def test_windows_and_requests_it_refuses_name_their_field(app, clock, stub):
    code, info, _ = await refused(
        stub.GetPrefetchHitRates(
            pb.GetPrefetchHitRatesRequest(company="acme", start_time=ts(START), end_time=ts(START - timedelta(hours=1)))
        )
    )
    assert (code, info.reason, info.metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "RANGE_INVALID",
        "end_time",
    )
    code, info, _ = await refused(
        stub.GetAuxiliarySpend(
            pb.GetAuxiliarySpendRequest(company="acme", start_time=ts(START - timedelta(days=401)), end_time=ts(START))
        )
    )
    assert (info.reason, info.metadata["field"]) == ("RANGE_TOO_LONG", "start_time")
    code, info, bad = await refused(stub.ListEvents(pb.ListEventsRequest(seat="ana")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_REQUIRED"
    assert [v.field for v in bad.field_violations] == ["company"]
    code, info, _ = await refused(stub.ListEvents(pb.ListEventsRequest(company="acme", page_size=-1)))
    assert info.reason == "PAGE_SIZE_INVALID"
    # An end in the first days of year 1 has nothing before it: an empty answer, not a failure.
    first_days = await stub.GetPrefetchHitRates(
        pb.GetPrefetchHitRatesRequest(company="acme", end_time=ts(datetime(1, 1, 3, tzinfo=UTC)))
    )
    assert list(first_days.days) == []


async def test_a_real_turn_start_is_counted_from_the_events_it_recorded(
    make_settings, dsn, clock, local_embedder, edge_index
):
    names = ["diary", "episodes", "skills", "profiles", "prefetch", "telemetry"]
    settings = make_settings(companies={"acme": {"roles": {"swe": {}}}})
    async with open_app(settings, dsn, names=names, clock=clock, embedder=local_embedder, index=edge_index) as app:
        diary = diary_grpc.DiaryServiceStub(app.channel)
        await diary.WriteNote(
            diary_pb.WriteNoteRequest(
                company="acme",
                seat="ana",
                content="Bob wants the deploy report by Friday",
                tier=diary_pb.NOTE_TIER_LONG,
            )
        )
        prefetch = pf_grpc.PrefetchServiceStub(app.channel)
        for i in range(2):
            clock.advance(minutes=1)
            await prefetch.BuildTurnContext(
                pf_pb.BuildTurnContextRequest(
                    company="acme", seat="ana", role="swe", turn_id=f"turn-{i}", ask="When is Bob's deploy report due?"
                )
            )
        clock.advance(seconds=1)  # the window ends at now, exclusive
        stub = pb_grpc.TelemetryServiceStub(app.channel)
        rates = await stub.GetPrefetchHitRates(pb.GetPrefetchHitRatesRequest(company="acme", seat="ana"))
        recorded = await read_events(app.infra.pool, "prefetch_summary", company="acme")
        assert len(recorded) == 2
        expected: dict[str, list[int]] = {}
        for event in recorded:
            for b in {blk["block"]: blk for blk in event["payload"]["blocks"]}.values():
                counts = expected.setdefault(b["block"], [0, 0])
                counts[0] += 1
        for event in recorded:
            hit_blocks = {blk["block"] for blk in event["payload"]["blocks"] if blk["hit"]}
            for name in hit_blocks:
                expected[name][1] += 1
        assert {t.block: [t.turn_count, t.hit_count] for t in rates.totals} == expected
        assert expected["personal_memory"][1] == 2  # the note was found both times
        spend = await stub.GetAuxiliarySpend(pb.GetAuxiliarySpendRequest(company="acme", seat="ana"))
        charged = await read_events(app.infra.pool, "auxiliary_spend", company="acme")
        assert sum(t.call_count for t in spend.totals) == len(charged) > 0
        assert {t.purpose for t in spend.totals} == {e["payload"]["purpose"] for e in charged}


async def test_only_inspect_of_the_same_company_may_read(make_settings, dsn, clock, edge_index):
    async with open_app(
        make_settings(), dsn, names=["telemetry"], clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as app:
        stub = pb_grpc.TelemetryServiceStub(app.channel)
        inspect, _ = await app.infra.tokens.issue("acme", ["inspect"])
        reader, _ = await app.infra.tokens.issue("acme", ["memory:read"])

        def bearer(token: str) -> tuple:
            return (("authorization", f"Bearer {token}"),)

        await stub.ListEvents(pb.ListEventsRequest(company="acme"), metadata=bearer(inspect))
        code, info, _ = await refused(stub.ListEvents(pb.ListEventsRequest(company="globex"), metadata=bearer(inspect)))
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
        code, info, _ = await refused(
            stub.ListSeatActivity(pb.ListSeatActivityRequest(company="acme"), metadata=bearer(reader))
        )
        assert (code, info.reason, info.metadata["scope"]) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "SCOPE_MISSING",
            "inspect",
        )
        # A credential bound to one seat reads that seat, never the whole company: naming no seat
        # is naming its own, naming another is refused.
        await app.infra.events.emit_strict("turn_completed", company="acme", seat="ana")
        await app.infra.events.emit_strict("turn_completed", company="acme", seat="bo")
        clock.advance(seconds=1)
        ana, _ = await app.infra.tokens.issue("acme", ["inspect"], seat="ana")
        own = await stub.ListEvents(pb.ListEventsRequest(company="acme"), metadata=bearer(ana))
        assert {e.seat for e in own.events} == {"ana"}
        listed = await stub.ListSeatActivity(pb.ListSeatActivityRequest(company="acme"), metadata=bearer(ana))
        assert [s.seat for s in listed.seats] == ["ana"] and listed.total_size == 1
        company_wide = await stub.ListSeatActivity(pb.ListSeatActivityRequest(company="acme"), metadata=bearer(inspect))
        assert [s.seat for s in company_wide.seats] == ["ana", "bo"]
        code, info, _ = await refused(
            stub.ListEvents(pb.ListEventsRequest(company="acme", seat="bo"), metadata=bearer(ana))
        )
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
