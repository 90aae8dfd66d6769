"""RecordEpisode and GetEpisode: one raw row per settled turn, idempotent on the run id, embedded
inline as ONE text (label, ask, what it did) under a two-second budget, stored without a vector
(never refused) when none can be had; refusals name their field."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import numpy as np
import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from libs.common.embeddings import pool
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from libs.common.events import read_events
from tests.support.app import open_app
from tests.support.embedders import unloadable_local_embedder
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import Reply, hash_vector, openai_provider
from tests.support.turns import ts

DOMAIN = "episodes.agentlearn.dev"


def turn(clock, turn_id: str, *, seat: str = "ana", days_ago: float = 0, **fields) -> pb.RecordEpisodeRequest:  # type: ignore[no-untyped-def]
    end = clock.now() - timedelta(days=days_ago)
    fields.setdefault("label", "Message from Ana: Slack message")
    fields.setdefault("outcome", pb.TURN_OUTCOME_DONE)
    fields.setdefault("start_time", ts(end - timedelta(minutes=5)))
    fields.setdefault("end_time", ts(end))
    return pb.RecordEpisodeRequest(company="acme", seat=seat, turn_id=turn_id, **fields)


@pytest.fixture
async def episodes(make_settings, dsn, clock, local_embedder, vector_index):
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        yield app, pb_grpc.EpisodeServiceStub(app.channel)


async def test_a_turn_is_stored_whole_with_its_vector_model_and_role(episodes, clock):
    app, stub = episodes
    ask = "Please rotate the staging database credentials.\n\tThe old ones leaked in #ops — ünïcödé kept.  "
    resp = await stub.RecordEpisode(
        turn(
            clock,
            "run-0001",
            ask=ask,
            what_it_did="Rotated the credentials and updated the vault entry.",
            work_item="jira:OPS-12",
            role="swe",
            review_outcome="done",
            tool_sequence=["vault.write", "slack.post"],
            tools_called=["vault.read", "vault.write", "vault.write", "slack.post"],
            skills_used=["rotate-secrets"],
            subjects=["ana"],
            conversation_id="C1/1700000000.1",
        )
    )
    ep = resp.episode
    assert resp.created and resp.embedding_skipped_reason == ""
    assert ep.kind == pb.EPISODE_KIND_RAW and ep.count == 1 and ep.turn_id == "run-0001"
    assert ep.ask == ask and ep.role == "swe" and ep.work_item == "jira:OPS-12"
    assert list(ep.tools_called) == ["vault.read", "vault.write", "vault.write", "slack.post"]
    assert ep.duration_ms == 5 * 60 * 1000
    assert (ep.embedding_model, ep.embedding_dimensions) == ("all-MiniLM-L6-v2", 384)
    got = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-0001"))
    assert got.episode == ep
    row = await app.infra.pool.fetchrow("SELECT embedding, indexed FROM episodes WHERE id = $1::uuid", ep.id)
    assert row["embedding"] is not None and row["indexed"] is True


@pytest.fixture
async def remote(make_settings, dsn, clock, scripted_openai, vector_index, request):
    """Episodes whose embedder is an OpenAI-compatible endpoint we script; its input is 256 tokens,
    or what the test passes indirectly (priced at three bytes a token)."""
    settings = make_settings(
        providers={
            "embeddings": openai_provider(
                scripted_openai, "scripted-embed", max_input_tokens=getattr(request, "param", 256)
            )
        },
        learning={"episodes": {"embed_budget_seconds": 0.5}},
    )
    embedder = OpenAICompatibleEmbedder(settings.providers.embeddings)
    async with open_app(settings, dsn, names=["episodes"], clock=clock, embedder=embedder, index=vector_index) as app:
        yield app, pb_grpc.EpisodeServiceStub(app.channel), scripted_openai
    await embedder.close()


async def test_the_vector_is_of_label_ask_and_what_it_did_as_one_text(remote, clock):
    _, stub, server = remote
    await stub.RecordEpisode(turn(clock, "r1", label="Ops ping", ask="Fix CI", what_it_did="Fixed it"))
    await stub.RecordEpisode(
        turn(clock, "r2", label="swe was assigned scheduled work weekly-report", what_it_did="Sent")
    )
    assert [b["input"] for b in server.received("embeddings")] == [
        ["Ops ping\nFix CI\nFixed it"],
        ["swe was assigned scheduled work weekly-report\nSent"],  # told nothing: no ask, no empty line
    ]


@pytest.mark.parametrize("remote", [10], indirect=True)
async def test_a_long_turn_is_split_between_words_and_its_pieces_pooled(remote, clock):
    app, stub, server = remote
    ask = " ".join(f"word{i}" for i in range(40))  # far past 30 bytes a piece
    resp = await stub.RecordEpisode(turn(clock, "r1", label="Long ask", ask=ask, what_it_did="Done"))
    [body] = server.received("embeddings")  # every piece in one request
    pieces = body["input"]
    assert len(pieces) > 5 and all(len(p.encode()) <= 30 for p in pieces)
    assert " ".join(" ".join(pieces).split()) == " ".join(f"Long ask {ask} Done".split())  # nothing dropped
    expected = pool([np.asarray(hash_vector(p, 64), dtype=np.float32) for p in pieces], [len(p) for p in pieces])
    stored = await app.infra.pool.fetchval("SELECT embedding FROM episodes WHERE id = $1::uuid", resp.episode.id)
    assert np.allclose(stored.to_numpy(), expected, atol=1e-6)


async def test_recording_a_run_id_twice_stores_one_row_and_embeds_once(remote, clock):
    app, stub, server = remote
    first = await stub.RecordEpisode(turn(clock, "r1", what_it_did="first account"))
    again = await stub.RecordEpisode(turn(clock, "r1", what_it_did="a redelivery's other account"))
    assert first.created and not again.created
    assert again.episode == first.episode  # the stored row, unchanged
    assert len(server.received("embeddings")) == 1
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 1
    # The run id is per seat: another seat's turn with the same id is its own row.
    other = await stub.RecordEpisode(turn(clock, "r1", seat="bob"))
    assert other.created and other.episode.id != first.episode.id


async def test_each_row_written_is_announced_once_as_episode_written(remote, clock):
    app, stub, _ = remote
    first = await stub.RecordEpisode(turn(clock, "r1", work_key="w1", outcome=pb.TURN_OUTCOME_FAILED))
    await stub.RecordEpisode(turn(clock, "r1", work_key="w1"))  # a repeat of the run: no row written
    await stub.RecordEpisode(turn(clock, "r2", work_key="w1"))  # a redelivery, collapsed: none either
    [event] = await read_events(app.infra.pool, "episode_written")
    assert (event["company"], event["seat"], event["turn_id"]) == ("acme", "ana", "r1")
    assert event["payload"]["episode_id"] == first.episode.id
    assert event["payload"]["outcome"] == "failed" and event["payload"]["episode_kind"] == "raw"
    assert event["payload"]["work_key"] == "w1" and event["payload"]["embedding_model"] == "scripted-embed"


async def test_episode_written_survives_a_failure_after_the_row_committed(episodes, clock):
    """The row is committed, then marking it indexed fails (a statement PostgreSQL refuses): the
    call fails, and its retry finds the row (a repeat, nothing written). The row's episode_written
    was announced with its commit, not lost with the failure after it."""
    app, stub = episodes
    pool = app.infra.pool
    await pool.execute(
        """CREATE FUNCTION refuse_index_mark() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'the index mark is refused'; END $$;
           CREATE TRIGGER refuse_index_mark BEFORE UPDATE OF indexed ON episodes
           FOR EACH ROW EXECUTE FUNCTION refuse_index_mark()"""
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.RecordEpisode(turn(clock, "r1"))
    await pool.execute("DROP TRIGGER refuse_index_mark ON episodes")
    again = await stub.RecordEpisode(turn(clock, "r1"))
    assert not again.created
    [event] = await read_events(pool, "episode_written")
    assert event["payload"]["episode_id"] == again.episode.id


async def test_a_redelivered_trigger_is_collapsed_into_its_works_row(remote, clock):
    """One raw row per work key (spec gate 5: the episode row's own work-key index collapses a
    redelivered trigger): the second run of the same work writes no row and embeds nothing; its run
    id names the first run's row for every read, a retry, and a skill's stamp."""
    app, stub, server = remote
    first = await stub.RecordEpisode(turn(clock, "r1", work_key="slack:C1/1700.1", what_it_did="first run"))
    again = await stub.RecordEpisode(turn(clock, "r2", work_key="slack:C1/1700.1", what_it_did="redelivered run"))
    assert first.created and not first.collapsed and first.episode.work_key == "slack:C1/1700.1"
    assert (again.created, again.collapsed) == (False, True)
    assert again.episode == first.episode
    assert len(server.received("embeddings")) == 1
    listed = await stub.ListEpisodes(pb.ListEpisodesRequest(company="acme", seat="ana"))
    assert listed.total_size == 1
    by_second = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="r2"))
    assert by_second.episode.id == first.episode.id
    retried = await stub.RecordEpisode(turn(clock, "r2", work_key="slack:C1/1700.1"))
    assert (retried.created, retried.collapsed, retried.episode.id) == (False, True, first.episode.id)
    marked = await stub.MarkEpisodesConsolidated(
        pb.MarkEpisodesConsolidatedRequest(company="acme", seat="ana", turn_ids=["r2"], skill_id="s-1")
    )
    assert marked.marked_count == 1
    # Other work, another seat's same work key, and a turn naming no key are rows of their own.
    other = await stub.RecordEpisode(turn(clock, "r3", work_key="slack:C1/1700.2"))
    bobs = await stub.RecordEpisode(turn(clock, "r1", seat="bob", work_key="slack:C1/1700.1"))
    keyless = [await stub.RecordEpisode(turn(clock, f"r{i}")) for i in (4, 5)]
    assert other.created and bobs.created and all(k.created for k in keyless)
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 5


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(delay=1.5), "timeout"),
        (Reply(status=429), "rate_limited"),
        (Reply(status=503), "unavailable"),
        (Reply(vectors=lambda inputs: [[0.0] * 64 for _ in inputs]), "unusable_vector"),
        (Reply(vectors=lambda inputs: [[float("nan")] * 64 for _ in inputs]), "unusable_vector"),
        # A proxy's page answered with 200 (a string to the client), an answer with no vectors.
        (Reply(raw=b"<html>captive portal</html>", content_type="text/html"), "unavailable"),
        (Reply(body={"object": "list"}), "unavailable"),
    ],
)
async def test_a_turn_without_a_vector_is_stored_never_refused(remote, clock, reply, reason):
    app, stub, server = remote
    server.push("embeddings", reply)
    resp = await stub.RecordEpisode(turn(clock, "r1", ask="Rotate the keys", what_it_did="Rotated"))
    assert resp.created and resp.embedding_skipped_reason == reason
    assert resp.episode.embedding_model == "" and resp.episode.embedding_dimensions == 0
    row = await app.infra.pool.fetchrow("SELECT ask, embedding FROM episodes WHERE id = $1::uuid", resp.episode.id)
    assert row["ask"] == "Rotate the keys" and row["embedding"] is None


async def test_a_turn_is_stored_without_a_vector_when_the_local_model_cannot_load(
    make_settings, dsn, clock, edge_index, monkeypatch, tmp_path
):
    # Non-ASCII: the text is split first, which tokenises and so loads the model there.
    embedder = unloadable_local_embedder(monkeypatch, tmp_path)
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=embedder, index=edge_index
    ) as app:
        stub = pb_grpc.EpisodeServiceStub(app.channel)
        resp = await stub.RecordEpisode(turn(clock, "r1", ask="Redeploy billing: the café team waits"))
        assert resp.created and resp.embedding_skipped_reason == "configuration"
        row = await app.infra.pool.fetchrow("SELECT ask, embedding FROM episodes WHERE id = $1::uuid", resp.episode.id)
        assert row["ask"] == "Redeploy billing: the café team waits" and row["embedding"] is None
    await embedder.close()


async def test_a_scheduled_turns_label_names_its_schedule_never_the_fires_run_id(episodes, clock):
    app, stub = episodes
    ok = await stub.RecordEpisode(turn(clock, "fire-7f3a9c", label="swe was assigned scheduled work weekly-report"))
    assert ok.created
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.RecordEpisode(turn(clock, "fire-81be02", label="swe was assigned scheduled work fire-81be02"))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "LABEL_NAMES_RUN_ID"
    assert info.domain == DOMAIN and info.metadata["turn_id"] == "fire-81be02"
    assert bad.field_violations[0].field == "label"
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 1


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"company": "bad handle!"}, "company", "FIELD_INVALID"),
        ({"seat": ""}, "seat", "FIELD_REQUIRED"),
        ({"turn_id": ""}, "turn_id", "FIELD_REQUIRED"),
        ({"turn_id": "x" * 201}, "turn_id", "FIELD_TOO_LONG"),
        ({"label": "  "}, "label", "FIELD_REQUIRED"),
        ({"outcome": pb.TURN_OUTCOME_UNSPECIFIED}, "outcome", "FIELD_REQUIRED"),
        ({"outcome": 42}, "outcome", "FIELD_INVALID"),
        ({"start_time": None}, "start_time", "FIELD_REQUIRED"),
        ({"end_time": None}, "end_time", "FIELD_REQUIRED"),
        ({"end_before_start": True}, "end_time", "END_BEFORE_START"),
        ({"work_item": "OPS-12"}, "work_item", "FIELD_INVALID"),
        ({"work_item": "linear:ENG-1"}, "work_item", "FIELD_INVALID"),
        ({"work_item": "native:"}, "work_item", "FIELD_INVALID"),
        ({"tool_sequence": ["search", ""]}, "tool_sequence[1]", "FIELD_REQUIRED"),
        ({"role": "no spaces allowed"}, "role", "FIELD_INVALID"),
    ],
)
async def test_bad_records_are_invalid_argument_naming_the_field(episodes, clock, change, field, reason):
    app, stub = episodes
    req = turn(clock, "run-1")
    for key, value in change.items():
        if key == "end_before_start":
            req.end_time.CopyFrom(ts(clock.now() - timedelta(hours=1)))
        elif value is None:
            req.ClearField(key)
        elif isinstance(value, list):
            req.ClearField(key)
            getattr(req, key).extend(value)
        else:
            setattr(req, key, value)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.RecordEpisode(req)
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.domain) == (reason, DOMAIN)
    assert bad.field_violations[0].field == field
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 0


async def test_get_by_id_or_run_id_and_never_another_seats_row(episodes, clock):
    _, stub = episodes
    mine = (await stub.RecordEpisode(turn(clock, "r1"))).episode
    theirs = (await stub.RecordEpisode(turn(clock, "r2", seat="bob"))).episode
    by_id = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", episode_id=mine.id))
    assert by_id.episode == mine
    for req in (
        pb.GetEpisodeRequest(company="acme", seat="ana", episode_id=theirs.id),
        pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="r2"),
        pb.GetEpisodeRequest(company="other", seat="ana", turn_id="r1"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.GetEpisode(req)
        code, info, _ = error_info(exc.value)
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "EPISODE_NOT_FOUND"
        assert info.domain == DOMAIN and info.metadata["seat"] == "ana"


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({}, "episode_id", "ONE_OF_REQUIRED"),
        ({"episode_id": "00000000-0000-0000-0000-000000000001", "turn_id": "r1"}, "episode_id", "ONE_OF_REQUIRED"),
        ({"episode_id": "not-a-uuid"}, "episode_id", "FIELD_INVALID"),
    ],
)
async def test_get_names_exactly_one_valid_key(episodes, kwargs, field, reason):
    _, stub = episodes
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", **kwargs))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == reason
    assert bad.field_violations[0].field == field


# ---- a self_iterate round is a mid-state: the turn's settled record supersedes it

ASKED = "Why does the nightly billing export fail for EUR invoices?"
ROUND_TOOLS = ["logs.search", "logs.read", "db.query", "db.query", "code.search", "review.request"]
SETTLED_TOOLS = ["code.edit", "tests.run", "export.rerun"]
SETTLED_ACCOUNT = "Patched the currency rounding in the exporter, ran the tests and re-ran the export: it succeeded."


def rounds(clock, *run_ids: str, work_key: str = "slack:C1/1700.1") -> list[pb.RecordEpisodeRequest]:  # type: ignore[no-untyped-def]
    """The records an engine sends for one turn: a self_iterate round per run id but the last (six
    tool calls each, the review sending it back), then the settled one (done, other tools), each
    round starting where the one before ended."""
    start = clock.now() - timedelta(minutes=10 * len(run_ids))
    out = []
    for i, run_id in enumerate(run_ids):
        settled = i == len(run_ids) - 1
        tools = SETTLED_TOOLS if settled else ROUND_TOOLS
        out.append(
            turn(
                clock,
                run_id,
                ask=ASKED,
                what_it_did=SETTLED_ACCOUNT if settled else f"Round {i + 1}: read the export logs; review wants a fix.",
                outcome=pb.TURN_OUTCOME_DONE if settled else pb.TURN_OUTCOME_SELF_ITERATE,
                review_outcome="approved" if settled else "needs_work",
                tool_sequence=tools[-2:],
                tools_called=tools,
                work_key=work_key,
                role="swe" if i == 0 else "",  # the settled record leaves the role out: the row keeps it
                start_time=ts(start + timedelta(minutes=10 * i)),
                end_time=ts(start + timedelta(minutes=10 * i + 8)),
            )
        )
    return out


async def _the_settled_row(app, stub, first: pb.Episode, settled: pb.RecordEpisodeResponse, *run_ids: str):  # type: ignore[no-untyped-def]
    """The one row of the seat is the first round's, settled by the last record, found by every run
    id, listed as evidence for clustered synthesis, and found by the settled text's vector."""
    ep = settled.episode
    assert (settled.created, settled.collapsed) == (True, False)
    assert ep.id == first.id and ep.turn_id == first.turn_id and ep.work_key == first.work_key
    assert ep.outcome == pb.TURN_OUTCOME_DONE and ep.review_outcome == "approved"
    assert list(ep.tools_called) == SETTLED_TOOLS and list(ep.tool_sequence) == SETTLED_TOOLS[-2:]
    assert ep.what_it_did == SETTLED_ACCOUNT and ep.role == "swe"
    assert ep.start_time == first.start_time  # the work began with its first round
    assert ep.duration_ms == (ep.end_time.ToDatetime() - ep.start_time.ToDatetime()).total_seconds() * 1000
    assert (ep.embedding_model, ep.embedding_dimensions) == ("all-MiniLM-L6-v2", 384)
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes WHERE seat = 'ana'") == 1
    for run_id in run_ids:
        got = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", turn_id=run_id))
        assert got.episode == ep
    evidence = await stub.ListEpisodes(
        pb.ListEpisodesRequest(
            company="acme",
            seat="ana",
            filter=pb.EpisodeFilter(
                kind=pb.EPISODE_KIND_RAW, outcomes=[pb.TURN_OUTCOME_DONE, pb.TURN_OUTCOME_FAILED], min_tool_calls=3
            ),
        )
    )
    assert [e.id for e in evidence.episodes] == [ep.id]
    found = await stub.SearchEpisodes(
        pb.SearchEpisodesRequest(
            company="acme",
            seat="ana",
            query="\n".join((ep.label, ASKED, SETTLED_ACCOUNT)),
            outcome_filter=pb.TURN_OUTCOME_DONE,  # the index point says the new outcome too
            lexical_limit=0,
        )
    )
    [hit] = found.hits
    assert hit.episode.id == ep.id and list(hit.found_by) == [pb.SEARCH_HALF_VECTOR] and hit.similarity > 0.99
    row = await app.infra.pool.fetchrow("SELECT indexed, fill_held_until FROM episodes WHERE id = $1::uuid", ep.id)
    assert row["indexed"] is True and row["fill_held_until"] is None
    return ep


async def test_the_settled_record_of_a_self_iterate_run_supersedes_its_row(episodes, clock):
    """The usual case: the settled round reuses the run id (the turn-start context is frozen per
    run id). The row stays the turn's one row and takes the settled record's account."""
    app, stub = episodes
    mid_state, settled = rounds(clock, "run-1", "run-1")
    first = await stub.RecordEpisode(mid_state)
    assert first.created and first.episode.outcome == pb.TURN_OUTCOME_SELF_ITERATE
    await _the_settled_row(app, stub, first.episode, await stub.RecordEpisode(settled), "run-1")
    events = await read_events(app.infra.pool, "episode_written")
    assert [(e["payload"]["outcome"], e["payload"]["superseded"]) for e in events] == [
        ("self_iterate", False),
        ("done", True),
    ]


async def test_a_settled_run_of_the_same_work_supersedes_the_self_iterate_row(episodes, clock):
    """The settled round under another run id, the same work key: not collapsed into the mid-state
    but settling it, its run id filed under the row."""
    app, stub = episodes
    mid_state, settled = rounds(clock, "run-1", "run-2")
    first = await stub.RecordEpisode(mid_state)
    await _the_settled_row(app, stub, first.episode, await stub.RecordEpisode(settled), "run-1", "run-2")
    marked = await stub.MarkEpisodesConsolidated(
        pb.MarkEpisodesConsolidatedRequest(company="acme", seat="ana", turn_ids=["run-2"], skill_id="s-1")
    )
    assert marked.marked_count == 1


async def test_a_later_self_iterate_record_never_changes_a_settled_row(episodes, clock):
    """Once settled (here by superseding its round), a row is the turn's: a self_iterate record of
    the run seen late is a repeat, one of another run of the work is collapsed, and a second settled
    record changes nothing either."""
    app, stub = episodes
    mid_state, settled = rounds(clock, "run-1", "run-1")
    late_round = pb.RecordEpisodeRequest()
    late_round.CopyFrom(mid_state)
    late_round.what_it_did = "A round the reflector saw late."
    await stub.RecordEpisode(mid_state)
    done = (await stub.RecordEpisode(settled)).episode
    assert done.outcome == pb.TURN_OUTCOME_DONE
    for run_id, collapsed in (("run-1", False), ("run-2", True)):
        late_round.turn_id = run_id
        again = await stub.RecordEpisode(late_round)
        assert (again.created, again.collapsed) == (False, collapsed) and again.episode == done
    settled.what_it_did = "Another account of the same run."
    assert (await stub.RecordEpisode(settled)).episode == done
    got = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-1"))
    assert got.episode == done and got.episode.what_it_did == SETTLED_ACCOUNT
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 1
    assert len(await read_events(app.infra.pool, "episode_written")) == 2


async def test_two_self_iterate_rounds_then_the_settled_one_are_one_done_row(episodes, clock):
    """A second self_iterate round changes nothing (as a repeat, or collapsed under another run id);
    the settled record then supersedes the first round's row, whichever run id it comes under."""
    app, stub = episodes
    for run_ids in (("run-1", "run-1", "run-1"), ("run-1", "run-2", "run-2")):
        await app.infra.pool.execute("TRUNCATE episodes CASCADE")
        first_round, second_round, settled = rounds(clock, *run_ids)
        first = await stub.RecordEpisode(first_round)
        second = await stub.RecordEpisode(second_round)
        assert not second.created and second.episode == first.episode
        assert second.collapsed == (run_ids[1] != run_ids[0])
        await _the_settled_row(app, stub, first.episode, await stub.RecordEpisode(settled), *sorted(set(run_ids)))


async def test_concurrent_settled_records_of_one_work_settle_it_once(episodes, clock):
    """Two settled records of the same self_iterate work at once (a redone reflection, a
    redelivery): one supersedes the row, the other answers it (collapsed under its run id); one row,
    one settled account, no update lost to the other."""
    app, stub = episodes
    mid_state, settled = rounds(clock, "run-1", "run-2")
    other = pb.RecordEpisodeRequest()
    other.CopyFrom(settled)
    other.turn_id, other.what_it_did = "run-3", "A concurrent account of the same work."
    first = await stub.RecordEpisode(mid_state)
    a, b = await asyncio.gather(stub.RecordEpisode(settled), stub.RecordEpisode(other))
    assert sorted((r.created, r.collapsed) for r in (a, b)) == [(False, True), (True, False)]
    winner = a if a.created else b
    assert winner.episode.id == first.episode.id and winner.episode.outcome == pb.TURN_OUTCOME_DONE
    assert (a if b.created else b).episode == winner.episode
    assert await app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 1
    for run_id in ("run-1", "run-2", "run-3"):
        got = await stub.GetEpisode(pb.GetEpisodeRequest(company="acme", seat="ana", turn_id=run_id))
        assert got.episode == winner.episode
    # The first records of a work racing each other: whichever lands first, the row ends settled.
    await app.infra.pool.execute("TRUNCATE episodes CASCADE")
    mid_state, settled = rounds(clock, "run-4", "run-5", work_key="slack:C1/1700.2")
    await asyncio.gather(stub.RecordEpisode(mid_state), stub.RecordEpisode(settled))
    [row] = await app.infra.pool.fetch("SELECT outcome, what_it_did FROM episodes")
    assert (row["outcome"], row["what_it_did"]) == ("done", SETTLED_ACCOUNT)


async def test_a_superseding_record_without_a_vector_drops_the_stale_point_for_the_fill(remote, clock):
    """The embedder down when the settled record arrives: the row is settled all the same, with no
    vector (the fill embeds its new text later), and the mid-state's point — of its old text — is
    no longer in the index."""
    app, stub, server = remote
    mid_state, settled = rounds(clock, "run-1", "run-1")
    first = await stub.RecordEpisode(mid_state)
    assert first.episode.embedding_model == "scripted-embed"
    server.push("embeddings", Reply(status=503))
    resp = await stub.RecordEpisode(settled)
    assert (resp.created, resp.embedding_skipped_reason) == (True, "unavailable")
    assert resp.episode.outcome == pb.TURN_OUTCOME_DONE and resp.episode.embedding_model == ""
    row = await app.infra.pool.fetchrow("SELECT embedding, indexed FROM episodes WHERE id = $1::uuid", first.episode.id)
    assert row["embedding"] is None and row["indexed"] is False
    old_text = "\n".join((first.episode.label, ASKED, first.episode.what_it_did))
    found = await stub.SearchEpisodes(
        pb.SearchEpisodesRequest(company="acme", seat="ana", query=old_text, lexical_limit=0)
    )
    assert list(found.hits) == [] and found.unreachable_by_vector_count == 1
