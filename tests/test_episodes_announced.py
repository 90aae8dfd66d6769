"""``episode_written`` is written by the statement that writes its row (an insert, or the supersede
of a self_iterate row), not emitted after the row's commit: a process killed between the two lost
the event for good, since the retry finds the row (a repeat, no event). Real episodes service over
gRPC on the embedded PostgreSQL."""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from tests.support.app import open_app
from tests.test_episodes_record import turn


class KilledAfterTheRow:
    """The service's event sink in a process killed right after a row's commit: the event emitted
    after it is never written (the kill, as the call sees it, is the error raised here)."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def emit(self, kind: str, **fields: Any) -> None:
        if kind == "episode_written":
            raise RuntimeError("the process was killed before the event was written")
        await self.inner.emit(kind, **fields)


@pytest.fixture
async def episodes(make_settings, dsn, clock, local_embedder, vector_index):
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        yield app, pb_grpc.EpisodeServiceStub(app.channel), app.components["episodes"].service


async def _record_then_killed(service, stub, request) -> None:  # type: ignore[no-untyped-def]
    events, service.events = service.events, KilledAfterTheRow(service.events)
    try:
        with contextlib.suppress(grpc.aio.AioRpcError):  # the call died (or answered: the event went in)
            await stub.RecordEpisode(request)
    finally:
        service.events = events


async def test_a_row_inserted_then_killed_before_its_event_still_has_its_event(episodes, clock):
    app, stub, service = episodes
    await _record_then_killed(service, stub, turn(clock, "r1"))
    again = await stub.RecordEpisode(turn(clock, "r1"))  # the retry: the row is there, a repeat
    assert not again.created
    [event] = await read_events(app.infra.pool, "episode_written")
    assert event["turn_id"] == "r1" and event["payload"]["episode_id"] == again.episode.id
    assert event["payload"]["embedding_model"] == again.episode.embedding_model
    assert event["payload"]["superseded"] is False


async def test_a_self_iterate_row_settled_then_killed_before_its_event_still_has_its_event(episodes, clock):
    app, stub, service = episodes
    first = await stub.RecordEpisode(turn(clock, "r1", work_key="w1", outcome=pb.TURN_OUTCOME_SELF_ITERATE))
    await _record_then_killed(service, stub, turn(clock, "r2", work_key="w1"))  # settles the row
    again = await stub.RecordEpisode(turn(clock, "r2", work_key="w1"))
    assert not again.created and again.episode.id == first.episode.id
    assert again.episode.outcome == pb.TURN_OUTCOME_DONE
    events = await read_events(app.infra.pool, "episode_written")
    assert [(e["turn_id"], e["payload"]["outcome"], e["payload"]["superseded"]) for e in events] == [
        ("r1", "self_iterate", False),
        ("r2", "done", True),
    ]
    assert {e["payload"]["episode_id"] for e in events} == {first.episode.id}


async def test_a_row_whose_event_postgres_refuses_is_written_alone(episodes, clock):
    """The event rides on the row's statement; should PostgreSQL refuse it, the row is not lost
    with it: it is written alone and the event emitted after it, best-effort (here refused too)."""
    app, stub, _ = episodes
    pool = app.infra.pool
    await pool.execute(
        """CREATE FUNCTION refuse_episode_event() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'events are refused'; END $$;
           CREATE TRIGGER refuse_episode_event BEFORE INSERT ON events
           FOR EACH ROW WHEN (NEW.kind = 'episode_written') EXECUTE FUNCTION refuse_episode_event()"""
    )
    try:
        inserted = await stub.RecordEpisode(turn(clock, "r1", work_key="w1", outcome=pb.TURN_OUTCOME_SELF_ITERATE))
        settled = await stub.RecordEpisode(turn(clock, "r1", work_key="w1"))
    finally:
        await pool.execute("DROP TRIGGER refuse_episode_event ON events")
    assert inserted.created and settled.created and settled.episode.id == inserted.episode.id
    assert settled.episode.outcome == pb.TURN_OUTCOME_DONE
    assert await read_events(pool, "episode_written") == []
