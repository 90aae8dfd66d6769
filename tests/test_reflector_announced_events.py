"""The events that announce a reflector write ride on that write's statement: ``turn_completed``
on the statement that queues the turn, and a pass's bookkeeping (its held events and charges, and
``reflection_completed``) on the statement that finishes its job and closes its record. They are
written exactly once, exactly when the write moves: a duplicate submit, a stale claim or a refused
close writes none of them (the held rows stay for their own writer), and a combined statement that
PostgreSQL refuses leaves the write to go alone, its events following on their own as before.
Real gRPC, real Postgres (the SIGKILL case is tests/test_reflector_kill.py)."""

from __future__ import annotations

import pytest

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.events import bookkeeping, read_events, write_bookkeeping
from libs.common.jobs import JobQueue
from services.reflector.domain import IllegalTransition, ReflectionState, TurnKey
from services.reflector.store import PostgresReflectionStore
from tests.support.app import open_app
from tests.support.turns import message, turn

PERSIST_ONLY = {"reflection": {"workers": ["persist_decider"]}}
BOB_PREFERS = [message("bob", "Thanks! I prefer weekly digests over daily pings.")]
KEY = TurnKey("acme", "ana", "run-1")


@pytest.fixture
def app_for(make_settings, dsn, clock, local_embedder, edge_index):  # type: ignore[no-untyped-def]
    def opener(**settings):  # type: ignore[no-untyped-def]
        s = make_settings(learning=PERSIST_ONLY, **settings)
        names = ["diary", "reflector"]
        return open_app(s, dsn, names=names, clock=clock, embedder=local_embedder, index=edge_index)

    return opener


async def _events(app, kind=None):  # type: ignore[no-untyped-def]
    return await read_events(app.infra.pool, kind)


async def test_turn_completed_is_written_once_with_the_turn_it_queued(app_for, clock):
    async with app_for() as app:
        stub = pb_grpc.ReflectorServiceStub(app.channel)
        t = turn("run-1", now=clock.now(), messages=BOB_PREFERS, tools=["github_search"])
        assert (await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))).queued
        assert not (await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))).queued  # a duplicate writes nothing
        [event] = await _events(app, "turn_completed")
        assert (event["company"], event["seat"], event["turn_id"]) == ("acme", "ana", "run-1")
        assert event["payload"] == {
            "role": "swe",
            "outcome": "TURN_OUTCOME_DONE",
            "label": t.label,
            "tool_calls": len(t.tools_called),
            "interactions": 1,
        }
        # Another seat's same run id is its own turn: its own event.
        other = turn("run-1", now=clock.now(), seat="bo", messages=BOB_PREFERS)
        assert (await stub.SubmitTurn(pb.SubmitTurnRequest(turn=other))).queued
        assert [e["seat"] for e in await _events(app, "turn_completed")] == ["ana", "bo"]


async def test_a_pass_writes_its_events_once_with_its_close(app_for, clock):
    async with app_for(company_defaults={"roles": {"swe": {}}}) as app:
        stub = pb_grpc.ReflectorServiceStub(app.channel)
        harness = app.components["reflector"].service.harness
        await stub.SubmitTurn(pb.SubmitTurnRequest(turn=turn("run-1", now=clock.now(), messages=BOB_PREFERS)))
        gated = turn("run-2", now=clock.now(), role="pm", messages=BOB_PREFERS)
        await stub.SubmitTurn(pb.SubmitTurnRequest(turn=gated))
        assert await harness.drain() == 2
        assert await harness.drain() == 0
        completed = {e["turn_id"]: e for e in await _events(app, "reflection_completed")}
        assert sorted(completed) == ["run-1", "run-2"]  # once each
        assert completed["run-1"]["payload"] == {
            "state": "completed",
            "gate": None,
            "workers": {"persist_decider": "wrote"},
            "failures": {},
        }
        assert completed["run-2"]["payload"] == {"state": "gated", "gate": "no_role", "workers": {}, "failures": {}}
        # The pass's held events went in with it, once.
        [decided] = await _events(app, "persist_decider_completed")
        assert decided["turn_id"] == "run-1"


async def test_a_stale_claim_or_a_refused_close_writes_no_event(app_for, clock):
    async with app_for() as app:
        pool, events = app.infra.pool, app.infra.events
        stub = pb_grpc.ReflectorServiceStub(app.channel)
        await stub.SubmitTurn(pb.SubmitTurnRequest(turn=turn("run-1", now=clock.now(), messages=BOB_PREFERS)))
        store = PostgresReflectionStore(pool)
        [job] = await JobQueue(pool).claim_many("reflection", "w-1", clock.now(), 30, 5)
        with bookkeeping() as batch:
            await events.emit("probe_held", company="acme")
            batch.charge("acme", "ana", clock.now().replace(minute=0, second=0, microsecond=0), 7)
            # Claimed, never taken: the close is refused; nothing moves, nothing is written.
            batch.announce("reflection_completed", clock.now(), company="acme", turn_id="run-1", state="completed")
            with pytest.raises(IllegalTransition):
                await store.finish_and_close(job, "w-1", KEY, ReflectionState.COMPLETED, None, clock.now())
            assert not batch.withdraw()  # what it announced did not happen: dropped
            await store.take(*KEY)
            # Another holder's claim (a stale one): nothing moves, nothing is written.
            batch.announce("reflection_completed", clock.now(), company="acme", turn_id="run-1", state="completed")
            assert not await store.finish_and_close(job, "w-2", KEY, ReflectionState.COMPLETED, None, clock.now())
            assert not batch.withdraw()
            assert await _events(app, "reflection_completed") == []
            assert await _events(app, "probe_held") == []
            assert await pool.fetchval("SELECT count(*) FROM token_spend") == 0
            # The held rows stay with their batch, open again, for its own writer.
            assert len(batch) == 3 and not batch.closed
            # The holder's close: every row goes in with it, once.
            batch.announce("reflection_completed", clock.now(), company="acme", turn_id="run-1", state="completed")
            assert await store.finish_and_close(job, "w-1", KEY, ReflectionState.COMPLETED, None, clock.now())
            assert not batch.withdraw() and len(batch) == 0
        await write_bookkeeping(pool, batch)  # the pass's writer: nothing left to write
        assert [e["turn_id"] for e in await _events(app, "reflection_completed")] == ["run-1"]
        assert len(await _events(app, "probe_held")) == 1
        spent = await pool.fetch("SELECT seat, tokens FROM token_spend ORDER BY seat")
        assert [(r["seat"], r["tokens"]) for r in spent] == [("", 7), ("ana", 7)]


async def test_a_combined_statement_refused_leaves_the_write_to_go_alone(app_for, clock):
    """PostgreSQL refuses the events (a check on the table, standing in for any refusal of the
    bookkeeping): the turn is queued and the pass closed all the same, and the events follow on
    their own, best-effort, as before: refused again, logged, and the write stands."""
    async with app_for() as app:
        pool = app.infra.pool
        stub = pb_grpc.ReflectorServiceStub(app.channel)
        harness = app.components["reflector"].service.harness
        await pool.execute("ALTER TABLE events ADD CONSTRAINT refuse_probe CHECK (kind <> 'turn_completed')")
        resp = await stub.SubmitTurn(pb.SubmitTurnRequest(turn=turn("run-1", now=clock.now(), messages=BOB_PREFERS)))
        assert resp.queued
        assert await pool.fetchval("SELECT state FROM reflections WHERE turn_id = 'run-1'") == "queued"
        assert await _events(app, "turn_completed") == []
        await pool.execute("ALTER TABLE events DROP CONSTRAINT refuse_probe")
        await pool.execute("ALTER TABLE events ADD CONSTRAINT refuse_probe CHECK (kind <> 'persist_decider_completed')")
        assert await harness.drain() == 1
        assert await pool.fetchval("SELECT state FROM reflections WHERE turn_id = 'run-1'") == "completed"
        assert await pool.fetchval("SELECT state FROM background_jobs") == "done"
        # The combined close was refused; the close went alone, and reflection_completed followed
        # with the pass's other rows in one batch of their own, which the refused row took down
        # whole (best-effort, logged), as it did before the rows rode on the close.
        assert await _events(app, "persist_decider_completed") == []
        assert await _events(app, "reflection_completed") == []
        clock.advance(seconds=60)
        assert await harness.drain() == 0  # closed once: nothing to take again
