"""ListEpisodes (recency and conversation paths, both kinds, pages), ListEpisodeSeats and
MarkEpisodesConsolidated — the reads the skills service's clustered synthesis makes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.turns import ts

DOMAIN = "episodes.agentlearn.dev"


class Turns:
    def __init__(self, stub, clock):  # type: ignore[no-untyped-def]
        self.stub, self.clock, self.n = stub, clock, 0

    async def add(  # type: ignore[no-untyped-def]
        self,
        *,
        seat="ana",
        company="acme",
        outcome=pb.TURN_OUTCOME_DONE,
        calls=1,
        conversation="",
        days_ago=0.0,
        final_round=(),
    ):
        self.n += 1
        end = self.clock.now() - timedelta(days=days_ago, seconds=1000 - self.n)  # later adds end later
        resp = await self.stub.RecordEpisode(
            pb.RecordEpisodeRequest(
                company=company,
                seat=seat,
                turn_id=f"run-{self.n}",
                label=f"turn {self.n}",
                outcome=outcome,
                tools_called=["tool"] * calls,
                tool_sequence=list(final_round),
                conversation_id=conversation,
                start_time=ts(end - timedelta(minutes=1)),
                end_time=ts(end),
            )
        )
        return resp.episode


@pytest.fixture
async def episodes(make_settings, dsn, clock, tmp_path):
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    index = QdrantEdgeIndex(tmp_path / "edge")
    settings = make_settings(learning={"episode_lifecycle": {"max_raw_episodes_per_agent": 3}})
    async with open_app(settings, dsn, names=["episodes"], clock=clock, embedder=None, index=index) as app:
        stub = pb_grpc.EpisodeServiceStub(app.channel)
        yield app, stub, Turns(stub, clock)
    await index.close()


async def pages(stub, size, **kw):  # type: ignore[no-untyped-def]
    seen, token, totals = [], "", set()
    while True:
        page = await stub.ListEpisodes(
            pb.ListEpisodesRequest(company="acme", seat="ana", page_size=size, page_token=token, **kw)
        )
        seen += list(page.episodes)
        totals.add(page.total_size)
        token = page.next_page_token
        if not token:
            return seen, totals


async def test_pages_newest_first_by_end_time_with_the_total(episodes):
    _, stub, turns = episodes
    rows = [await turns.add() for _ in range(7)]
    await turns.add(seat="bob")
    seen, totals = await pages(stub, 3)
    assert [e.id for e in seen] == [r.id for r in reversed(rows)]
    assert totals == {7}
    first = await stub.ListEpisodes(pb.ListEpisodesRequest(company="acme", seat="ana"))
    assert len(first.episodes) == 7 and first.next_page_token == ""  # default page 20


async def test_the_page_size_is_clamped_to_two_hundred(episodes):
    _, stub, turns = episodes
    for _ in range(201):
        await turns.add()
    page = await stub.ListEpisodes(pb.ListEpisodesRequest(company="acme", seat="ana", page_size=10_000))
    assert len(page.episodes) == 200 and page.next_page_token and page.total_size == 201


async def test_filters_by_outcome_tool_calls_and_conversation(episodes):
    _, stub, turns = episodes
    done5 = await turns.add(calls=5)
    failed6 = await turns.add(outcome=pb.TURN_OUTCOME_FAILED, calls=6)
    await turns.add(calls=4)
    await turns.add(outcome=pb.TURN_OUTCOME_SELF_ITERATE, calls=9)
    thread = [await turns.add(conversation="C1/17.1") for _ in range(2)]
    settled = pb.EpisodeFilter(
        kind=pb.EPISODE_KIND_RAW, outcomes=[pb.TURN_OUTCOME_DONE, pb.TURN_OUTCOME_FAILED], min_tool_calls=5
    )
    seen, totals = await pages(stub, 1, filter=settled)
    assert [e.id for e in seen] == [failed6.id, done5.id] and totals == {2}
    seen, _ = await pages(stub, 5, filter=pb.EpisodeFilter(conversation_id="C1/17.1"))
    assert [e.id for e in seen] == [t.id for t in reversed(thread)]


async def test_min_tool_calls_counts_the_final_round_when_no_calls_were_reported(episodes):
    """A turn reported with its final round only (no tools_called) has that round as its run of
    tools, as the synthesizer's own gate counts it: the clustered pass, which lists its evidence by
    min_tool_calls, must see the same turns the single-turn path does."""
    _, stub, turns = episodes
    five = ["jira_search", "git_diff", "run_tests", "git_push", "open_pr"]
    only_final = await turns.add(calls=0, final_round=five)
    await turns.add(calls=0, final_round=five[:2])
    both = await turns.add(calls=5, final_round=five[-1:])  # tools_called wins over its final round
    seen, _ = await pages(stub, 5, filter=pb.EpisodeFilter(min_tool_calls=5))
    assert {e.id for e in seen} == {only_final.id, both.id}


async def test_both_kinds_are_listed_and_the_kind_filter_separates_them(episodes):
    app, stub, turns = episodes
    for _ in range(3):
        await turns.add(days_ago=40)
    for _ in range(2):
        await turns.add()
    report = await app.passes()["episode-lifecycle"].run()
    assert report.clusters_compacted == 1
    both, _ = await pages(stub, 10)
    assert [e.kind for e in both].count(pb.EPISODE_KIND_COMPACTED) == 1 and len(both) == 5
    [compacted], _ = await pages(stub, 10, filter=pb.EpisodeFilter(kind=pb.EPISODE_KIND_COMPACTED))
    assert compacted.count == 3 and len(compacted.exemplar_turn_ids) == 2 and compacted.turn_id == ""
    raw, _ = await pages(stub, 10, filter=pb.EpisodeFilter(kind=pb.EPISODE_KIND_RAW))
    assert len(raw) == 4 and set(compacted.exemplar_turn_ids) <= {e.turn_id for e in raw}


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"page_size": -1}, "page_size", "PAGE_SIZE_INVALID"),
        ({"page_token": "garbage"}, "page_token", "PAGE_TOKEN_INVALID"),
        ({"filter": pb.EpisodeFilter(min_tool_calls=-1)}, "filter.min_tool_calls", "FIELD_INVALID"),
        ({"filter": pb.EpisodeFilter(outcomes=[pb.TURN_OUTCOME_UNSPECIFIED])}, "filter.outcomes[0]", "FIELD_INVALID"),
        ({"filter": pb.EpisodeFilter(kind=7)}, "filter.kind", "FIELD_INVALID"),
        ({"company": ""}, "company", "FIELD_REQUIRED"),
    ],
)
async def test_bad_listings_are_refused_naming_the_field(episodes, kwargs, field, reason):
    _, stub, _ = episodes
    req = {"company": "acme", "seat": "ana", **kwargs}
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.ListEpisodes(pb.ListEpisodesRequest(**req))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and (info.reason, info.domain) == (reason, DOMAIN)
    assert bad.field_violations[0].field == field


async def test_a_page_token_only_continues_its_own_listing(episodes):
    _, stub, turns = episodes
    for _ in range(3):
        await turns.add()
    page = await stub.ListEpisodes(pb.ListEpisodesRequest(company="acme", seat="ana", page_size=1))
    for other in (
        pb.ListEpisodesRequest(company="acme", seat="bob", page_token=page.next_page_token),
        pb.ListEpisodesRequest(
            company="acme",
            seat="ana",
            page_token=page.next_page_token,
            filter=pb.EpisodeFilter(outcomes=[pb.TURN_OUTCOME_DONE]),
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.ListEpisodes(other)
        code, info, _ = error_info(exc.value)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "PAGE_TOKEN_INVALID"


# ------------------------------------------------------------------------------------------- seats


@pytest.mark.parametrize(
    "ends",
    [
        # The last day a Timestamp may hold: every token these pages issue is accepted back.
        [datetime(9999, 12, 31, 0, 0, second, tzinfo=UTC) for second in range(3)],
        [datetime(9999, 12, 31, 23, 59, 59, 999_997 + micro, tzinfo=UTC) for micro in range(3)],
        # And the first.
        [datetime(1, 1, 1, 0, 0, second, tzinfo=UTC) for second in range(3)],
    ],
    ids=["last-day", "last-microseconds", "first-day"],
)
async def test_pages_continue_through_episodes_at_the_edges_of_the_timestamp_range(episodes, ends):
    _, stub, _ = episodes
    for i, end in enumerate(ends):
        await stub.RecordEpisode(
            pb.RecordEpisodeRequest(
                company="acme",
                seat="ana",
                turn_id=f"edge-{i}",
                label=f"edge {i}",
                outcome=pb.TURN_OUTCOME_DONE,
                start_time=ts(end),
                end_time=ts(end),
            )
        )
    seen, _ = await pages(stub, 1)
    assert [e.turn_id for e in seen] == ["edge-2", "edge-1", "edge-0"]


async def test_seats_with_raw_rows_page_by_company_then_seat(episodes):
    _, stub, turns = episodes
    for company, seat in [("beta", "zed"), ("acme", "bob"), ("acme", "ana"), ("beta", "amy"), ("acme", "ana")]:
        await turns.add(company=company, seat=seat)
    seen, token = [], ""
    while True:
        page = await stub.ListEpisodeSeats(pb.ListEpisodeSeatsRequest(page_size=2, page_token=token))
        seen += [(s.company, s.seat) for s in page.seats]
        token = page.next_page_token
        if not token:
            break
    assert seen == [("acme", "ana"), ("acme", "bob"), ("beta", "amy"), ("beta", "zed")]
    only = await stub.ListEpisodeSeats(pb.ListEpisodeSeatsRequest(company="beta", page_size=1))
    assert [(s.company, s.seat) for s in only.seats] == [("beta", "amy")]
    rest = await stub.ListEpisodeSeats(pb.ListEpisodeSeatsRequest(company="beta", page_token=only.next_page_token))
    assert [(s.company, s.seat) for s in rest.seats] == [("beta", "zed")] and rest.next_page_token == ""
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.ListEpisodeSeats(pb.ListEpisodeSeatsRequest(company="acme", page_token=only.next_page_token))
    assert error_info(exc.value)[1].reason == "PAGE_TOKEN_INVALID"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.ListEpisodeSeats(pb.ListEpisodeSeatsRequest(page_size=-5))
    assert error_info(exc.value)[2].field_violations[0].field == "page_size"


# ------------------------------------------------------------------------------- consolidation


async def test_mark_consolidated_stamps_the_seats_raw_rows_only(episodes, clock):
    app, stub, turns = episodes
    a, b = await turns.add(), await turns.add()
    theirs = await turns.add(seat="bob")
    resp = await stub.MarkEpisodesConsolidated(
        pb.MarkEpisodesConsolidatedRequest(
            company="acme", seat="ana", turn_ids=[a.turn_id, b.turn_id, theirs.turn_id, "run-404"], skill_id="sk-1"
        )
    )
    assert resp.marked_count == 2
    got = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", turn_id=a.turn_id))
    assert got.episode.consolidated_into_skill_id == "sk-1"
    bob = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="bob", turn_id=theirs.turn_id))
    assert bob.episode.consolidated_into_skill_id == ""
    # Stamping again with the same skill keeps the first stamp time: the grace runs from it.
    first = await app.infra.pool.fetchval("SELECT consolidated_time FROM episodes WHERE turn_id = $1", a.turn_id)
    clock.advance(days=3)
    again = await stub.MarkEpisodesConsolidated(
        pb.MarkEpisodesConsolidatedRequest(company="acme", seat="ana", turn_ids=[a.turn_id], skill_id="sk-1")
    )
    assert again.marked_count == 1
    assert (
        await app.infra.pool.fetchval("SELECT consolidated_time FROM episodes WHERE turn_id = $1", a.turn_id) == first
    )


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"turn_ids": ["r1"]}, "skill_id", "FIELD_REQUIRED"),
        ({"turn_ids": [f"r{i}" for i in range(501)], "skill_id": "sk"}, "turn_ids", "TOO_MANY_IDS"),
        ({"turn_ids": ["r1", ""], "skill_id": "sk"}, "turn_ids[1]", "FIELD_REQUIRED"),
    ],
)
async def test_bad_consolidation_marks_are_refused(episodes, kwargs, field, reason):
    _, stub, _ = episodes
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.MarkEpisodesConsolidated(pb.MarkEpisodesConsolidatedRequest(company="acme", seat="ana", **kwargs))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == reason
    assert bad.field_violations[0].field == field
