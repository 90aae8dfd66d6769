"""The vector fill for episodes: the diary's minute, budgets and hold-backs, over raw rows only, plus
the long-row rule (a row longer than a minute's bytes goes a request at a time across minutes, its
pieces kept, and a refused piece's retry resumes at that piece). Run against a scripted
OpenAI-compatible embeddings endpoint over real HTTP; each ``minute()`` is one run of the pass."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from agentlearn.common.v1 import embedding_pb2
from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from libs.common.embeddings import Vector, pool
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from libs.common.fill import FillRow
from libs.common.vector_rows import TableFillSource
from services.episodes.domain import vector_text
from services.episodes.passes import RAW_EPISODES
from tests.support.app import open_app
from tests.support.fill import FillMinutes, inputs
from tests.support.scripted_openai import Reply, hash_vector
from tests.support.turns import raw_episode

PASS = {"diary": "diary-fill", "episodes": "episode-fill"}


class Fill(FillMinutes):
    """Records turns with no embedder (so they have no vector), then runs minutes of the fill."""

    ROWS_SQL = (
        "SELECT id, kind, label, ask, what_it_did, embedding, embedding_model, embedding_dims, "
        "indexed, fill_held_until FROM episodes"
    )

    def __init__(self, make_settings, dsn, clock, server, index):  # type: ignore[no-untyped-def]
        super().__init__(make_settings, dsn, clock, server, index)
        self.n = 0

    def settings(self, model: str = "scripted-embed", dims: int | None = None, **fill):  # type: ignore[no-untyped-def]
        emb = self.embeddings(model, dims, fill)
        return self.make_settings(
            providers={"embeddings": emb},
            learning={"fill": fill, "episode_lifecycle": {"max_raw_episodes_per_agent": 3}},
        )

    async def record(self, seat: str, *texts: tuple[str, str, str], days_ago: float = 0) -> list[str]:
        ids = []
        async with open_app(
            self.make_settings(learning={"episode_lifecycle": {"max_raw_episodes_per_agent": 3}}),
            self.dsn,
            names=["episodes"],
            clock=self.clock,
            embedder=None,
            index=self.index,
        ) as app:
            self.app = app
            stub = pb_grpc.EpisodeServiceStub(app.channel)
            for label, ask, what in texts:
                self.n += 1
                self.clock.advance(seconds=1)
                end = self.clock.now() - timedelta(days=days_ago)
                resp = await stub.RecordEpisode(
                    raw_episode(seat, f"run-{self.n}", end, label, ask, what, ["jira.search"])
                )
                assert resp.episode.embedding_model == "" and resp.embedding_skipped_reason == "unconfigured"
                ids.append(resp.episode.id)
        return ids

    async def fold(self):  # type: ignore[no-untyped-def]
        """One lifecycle pass (offline rules), as the runner runs it."""
        async with open_app(
            self.settings(), self.dsn, names=["episodes"], clock=self.clock, embedder=None, index=self.index
        ) as app:
            return await app.passes()["episode-lifecycle"].run()

    async def minute(self, settings=None, names=("episodes",), **fill):  # type: ignore[no-untyped-def]
        results = await self.run_passes(settings or self.settings(**fill), list(names), PASS)
        return results["episodes"]["fill"] if list(names) == ["episodes"] else results


@pytest.fixture
def fill(make_settings, dsn, clock, scripted_openai, vector_index):
    return Fill(make_settings, dsn, clock, scripted_openai, vector_index)


async def test_rows_without_a_vector_are_filled_from_their_one_text_indexed_and_found(fill, scripted_openai):
    ids = await fill.record("ana", ("Ops ping", "Fix CI", "Fixed"), ("Bob asks", "", "Answered"))
    report = await fill.minute()
    assert (report.filled, report.requests, report.ended_by) == (2, 1, None)
    assert inputs(scripted_openai) == [["Ops ping\nFix CI\nFixed", "Bob asks\nAnswered"]]
    assert fill.filled() == set(ids) and all(r["indexed"] for r in fill.rows.values())
    embedder = OpenAICompatibleEmbedder(fill.settings().providers.embeddings)
    [vec] = await embedder.embed(["Ops ping\nFix CI\nFixed"])
    await embedder.close()
    async with open_app(
        fill.settings(), fill.dsn, names=["episodes"], clock=fill.clock, embedder=None, index=fill.index
    ) as app:
        resp = await pb_grpc.EpisodeServiceStub(app.channel).SearchEpisodes(
            pb.SearchEpisodesRequest(
                company="acme",
                seat="ana",
                lexical_limit=0,
                query_embedding=embedding_pb2.Embedding(values=vec.tolist(), model=vec.model),
            )
        )
        assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
        assert resp.hits[0].episode.id == ids[0] and resp.hits[0].similarity == pytest.approx(1.0, abs=1e-5)
    scripted_openai.clear()
    again = await fill.minute()
    assert again.requests == 0 and inputs(scripted_openai) == []


async def test_a_compacted_row_is_never_offered_to_the_fill(fill, scripted_openai):
    recent = await fill.record("ana", *[(f"Recent {i}", "", "ok") for i in range(3)])
    old = await fill.record("ana", *[("Rotate credentials", f"rotate {env}", "Rotated") for env in "abc"], days_ago=40)
    assert (await fill.fold()).clusters_compacted == 1
    report = await fill.minute()
    assert report.filled == 3 + 2  # the recent rows and the fold's two exemplars
    raw = [r for r in fill.rows.values() if r["kind"] == "raw"]
    sent = sorted(t for body in inputs(scripted_openai) for t in body)
    assert sent == sorted(vector_text(r["label"], r["ask"], r["what_it_did"]) for r in raw)
    [compacted] = [r for r in fill.rows.values() if r["kind"] == "compacted"]
    assert compacted["embedding"] is None and not compacted["indexed"]
    assert set(recent) <= fill.filled() and len(set(old) & fill.filled()) == 2
    scripted_openai.clear()
    assert (await fill.minute()).requests == 0  # the compacted row is not pending, ever


async def test_a_long_row_goes_a_request_at_a_time_across_minutes_and_resumes_where_it_stopped(fill, scripted_openai):
    ask = " ".join(f"w{i:03d}" for i in range(380))  # 1,899 bytes, plus the label and the account
    [row] = await fill.record("ana", ("Long ask", ask, "Done"))
    settings, sent_first, cont = await fill.first_minute_of_a_long_row()
    assert cont["payload"]["row"] == row and cont["payload"]["source"] == "episodes"
    assert cont["payload"]["pieces_in"] == len(sent_first)
    second, sent_second = await fill.next_minute(settings)
    pieces = sent_first + sent_second
    assert len(pieces) == cont["payload"]["pieces_total"]  # nothing sent twice
    assert " ".join(pieces).split() == f"Long ask\n{ask}\nDone".split()
    assert second.filled == 1 and row in fill.filled()
    # The vector is the pool of the whole text.
    expected = pool([np.asarray(hash_vector(p, 64), dtype=np.float32) for p in pieces], [len(p) for p in pieces])
    assert np.allclose(fill.rows[row]["embedding"].to_numpy(), expected, atol=1e-6)


async def test_a_failure_not_about_the_row_ends_the_minute_where_it_falls_and_the_next_resends_it(
    fill, scripted_openai
):
    ask = " ".join(f"w{i:03d}" for i in range(380))
    [row] = await fill.record("ana", ("Long ask", ask, "Done"))
    settings = fill.settings(company_bytes_per_minute=1500, max_input_tokens=100, batch_size=2)
    scripted_openai.push("embeddings", Reply(), Reply(status=429))
    first = await fill.minute(settings)
    sent = inputs(scripted_openai)
    assert first.ended_by == "rate_limited" and first.continued == 1 and len(sent) == 2
    kept, refused = sent
    scripted_openai.clear()
    await fill.minute(settings)
    assert inputs(scripted_openai)[0] == refused  # the same request again, not the row from its start
    while row not in fill.filled():
        await fill.minute(settings)
    pieces = kept + [p for body in inputs(scripted_openai) for p in body]
    assert " ".join(pieces).split() == f"Long ask\n{ask}\nDone".split()


async def test_a_refused_piece_holds_the_row_and_its_retry_resumes_at_that_piece(fill, scripted_openai):
    ask = " ".join(f"w{i:03d}" for i in range(380)).replace("w200", "POISON")
    [row] = await fill.record("ana", ("Long ask", ask, "Done"))
    [other] = await fill.record("bob", ("Short", "", "ok"))
    settings = await fill.first_minute_refusing("POISON")
    second = await fill.minute(settings)
    assert second.refused_held == 1
    assert fill.rows[row]["fill_held_until"] is not None
    assert other in fill.filled()  # the seat behind it is filled meanwhile
    kept = [e["payload"]["pieces_in"] for e in fill.events_of("memory_fill_input_continued")]
    assert kept
    scripted_openai.rule("embeddings", None)
    scripted_openai.clear()
    await fill.minute(settings)
    assert inputs(scripted_openai) == []  # held for the hour
    fill.clock.advance(hours=1)
    await fill.minute(settings)
    assert "POISON" in inputs(scripted_openai)[0][0]  # resumed at the refused piece, not the first
    await fill.minute(settings)
    assert row in fill.filled()


async def test_the_company_byte_budget_is_shared_with_the_diary(fill, scripted_openai):
    await fill.record("ana", *[(f"episode {i:02d} xxxxxxxxxxxxxxxxxxxxxx", "", "") for i in range(3)])  # 33 bytes
    async with open_app(
        fill.make_settings(), fill.dsn, names=["diary"], clock=fill.clock, embedder=None, index=fill.index
    ) as app:
        stub = diary_grpc.DiaryServiceStub(app.channel)
        for i in range(3):
            await stub.WriteNote(
                diary_pb.WriteNoteRequest(
                    company="acme", seat="ana", content=f"note {i:02d} xxxxxxxxxxxxxxxxxxxxxxxxx", tier=1
                )
            )
    settings = fill.settings(batch_size=1, company_bytes_per_minute=100)
    results = await fill.minute(settings, names=("diary", "episodes"))
    assert (results["diary"]["fill"].filled, results["diary"]["fill"].bytes) == (3, 99)
    assert (results["episodes"]["fill"].requests, results["episodes"]["fill"].ended_by) == (0, "bytes")
    report = await fill.minute(settings)
    assert report.filled == 3


async def _notes(fill, *contents: str) -> None:  # type: ignore[no-untyped-def]
    async with open_app(
        fill.make_settings(), fill.dsn, names=["diary"], clock=fill.clock, embedder=None, index=fill.index
    ) as app:
        stub = diary_grpc.DiaryServiceStub(app.channel)
        for content in contents:
            await stub.WriteNote(diary_pb.WriteNoteRequest(company="acme", seat="ana", content=content, tier=1))


@pytest.mark.parametrize("reply", [Reply(status=429), Reply(status=503), Reply(delay=1.0)])
async def test_a_provider_that_ends_the_minute_ends_it_for_every_fill_of_the_process(fill, scripted_openai, reply):
    """The diary's fill meets a rate limit (or a server error, or a timeout): the episodes' fill that
    runs after it in the same minute sends nothing — it used to keep sending that minute."""
    await fill.record("ana", ("an episode", "", ""))
    await _notes(fill, "a note")
    scripted_openai.push("embeddings", reply)
    results = await fill.minute(fill.settings(), names=("diary", "episodes"))
    diary, episodes = results["diary"]["fill"], results["episodes"]["fill"]
    assert diary.requests == 1 and diary.ended_by in ("rate_limited", "unavailable", "timeout")
    assert (episodes.requests, episodes.ended_by) == (0, diary.ended_by)
    assert len(scripted_openai.received("embeddings")) == 1
    results = await fill.minute(fill.settings(), names=("diary", "episodes"))  # the next minute
    assert results["diary"]["fill"].filled == 1 and results["episodes"]["fill"].filled == 1


async def test_the_request_budget_is_the_processs_not_each_fills(fill, scripted_openai):
    await fill.record("ana", ("episode one", "", ""), ("episode two", "", ""))
    await _notes(fill, "note one", "note two")
    results = await fill.minute(fill.settings(batch_size=1, requests_per_minute=2), names=("diary", "episodes"))
    assert (results["diary"]["fill"].requests, results["episodes"]["fill"].requests) == (2, 0)
    assert results["episodes"]["fill"].ended_by == "requests"


async def test_the_request_budget_is_the_deployments_fill_pods_share_it(fill, scripted_openai):
    """On Kubernetes each fill is a pod of its own: the episodes' fill, run by another process in
    the minute the diary's spent the requests, sends nothing (it used to have a sixteen of its own:
    three fill pods sent up to 48 a minute)."""
    await fill.record("ana", ("episode one", "", ""), ("episode two", "", ""))
    await _notes(fill, "note one", "note two")
    settings = fill.settings(batch_size=1, requests_per_minute=2)
    diary = await fill.minute(settings, names=("diary",))
    assert diary["diary"]["fill"].requests == 2
    fill.clock.advance(seconds=-61)  # the same minute, in another process
    episodes = await fill.minute(settings)
    assert (episodes.requests, episodes.ended_by) == (0, "requests")
    assert len(scripted_openai.received("embeddings")) == 2
    assert (await fill.minute(settings)).requests == 2  # the next minute


async def test_a_provider_that_ends_the_minute_ends_it_for_the_fills_of_other_processes(fill, scripted_openai):
    """The diary's fill pod met a rate limit: the episodes' fill pod, later in that minute, sends
    nothing."""
    await fill.record("ana", ("an episode", "", ""))
    await _notes(fill, "a note")
    scripted_openai.push("embeddings", Reply(status=429))
    diary = await fill.minute(fill.settings(), names=("diary",))
    assert diary["diary"]["fill"].ended_by == "rate_limited"
    fill.clock.advance(seconds=-61)  # the same minute, in another process
    episodes = await fill.minute(fill.settings())
    assert (episodes.requests, episodes.ended_by) == (0, "rate_limited")
    assert len(scripted_openai.received("embeddings")) == 1
    assert (await fill.minute(fill.settings())).filled == 1  # the next minute


async def test_rows_of_a_model_the_company_left_are_filled_again(fill, scripted_openai):
    ids = await fill.record("ana", ("one", "", ""), ("two", "", ""))
    await fill.minute()
    assert {r["embedding_model"] for r in fill.rows.values()} == {"scripted-embed"}
    report = await fill.minute(fill.settings(model="new-model", dims=32))
    assert report.filled == 2
    assert {(r["embedding_model"], r["embedding_dims"]) for r in fill.rows.values()} == {("new-model", 32)}
    assert set(ids) == fill.filled()
    scripted_openai.clear()
    assert (await fill.minute(fill.settings(model="new-model", dims=32))).requests == 0


async def test_a_vector_filled_from_a_text_superseded_meanwhile_is_not_stored(make_settings, dsn, clock, vector_index):
    """A self_iterate row is rewritten when its turn's settled record supersedes it: a vector the
    fill embedded from the round's text before that is not stored on the settled row (whose text
    the fill embeds next); the guard is the row's one text exactly, whitespace-only parts left out
    as ``vector_text`` leaves them."""
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=None, index=vector_index
    ) as app:
        stub = pb_grpc.EpisodeServiceStub(app.channel)
        source = TableFillSource(RAW_EPISODES, app.infra.pool, vector_index)
        vector = Vector(np.full(4, 0.5, dtype=np.float32), "m")

        async def pending() -> FillRow:
            [row] = await source.pending("acme", "ana", "m", 4, "fp", clock.now(), 10)
            return row

        def record(outcome: int, what: str, ask: str = "Fix CI") -> pb.RecordEpisodeRequest:
            return raw_episode("ana", "run-1", clock.now(), "Ops ping", ask, what, ["ci.logs"], outcome)

        await stub.RecordEpisode(record(pb.TURN_OUTCOME_SELF_ITERATE, "Round 1: read the logs"))
        read = await pending()
        assert read.text == "Ops ping\nFix CI\nRound 1: read the logs"
        settled = await stub.RecordEpisode(record(pb.TURN_OUTCOME_DONE, "Fixed the flaky step", ask="\u00a0\u3000 "))
        assert settled.created and settled.episode.outcome == pb.TURN_OUTCOME_DONE
        await source.store_vector(read, vector)  # embedded from the round's text: not the row's any more
        stored = "SELECT embedding_model FROM episodes WHERE id = $1::uuid"
        assert await app.infra.pool.fetchval(stored, settled.episode.id) is None
        read = await pending()
        assert (
            read.text
            == vector_text("Ops ping", "\u00a0\u3000 ", "Fixed the flaky step")
            == ("Ops ping\nFixed the flaky step")
        )
        await source.store_vector(read, vector)
        assert await app.infra.pool.fetchval(stored, settled.episode.id) == "m"
