"""The reflector's harness: durable queueing, the gates in order and by name, worker isolation and
failure kinds, and the persist decider's rules. Real gRPC, real Postgres; the model is the offline
rules or a scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from libs.common.jobs import JobQueue
from services.reflector import erasure
from services.reflector.domain import IllegalTransition, ReflectionState, TurnKey, WorkerOutcome, WorkerStatus
from services.reflector.store import PostgresReflectionStore
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import Reply
from tests.support.turns import message, turn

PERSIST_ONLY = {"reflection": {"workers": ["persist_decider"]}}


class Env:
    def __init__(self, app):  # type: ignore[no-untyped-def]
        self.app = app
        self.stub = pb_grpc.ReflectorServiceStub(app.channel)
        self.diary = diary_grpc.DiaryServiceStub(app.channel)
        self.harness = app.components["reflector"].service.harness

    async def submit(self, t: pb.TurnCompleted) -> pb.SubmitTurnResponse:
        return await self.stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))

    async def reflection(self, turn_id: str, seat: str = "ana") -> pb.Reflection:
        resp = await self.stub.GetReflection(pb.GetReflectionRequest(company="acme", seat=seat, turn_id=turn_id))
        return resp.reflection

    async def notes(self, seat: str = "ana") -> list:
        resp = await self.diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat=seat))
        return list(resp.notes)

    def worker(self, reflection: pb.Reflection, name: str) -> pb.WorkerOutcome:
        [found] = [w for w in reflection.workers if w.worker == name]
        return found


@pytest.fixture
def env_for(make_settings, dsn, clock, local_embedder, edge_index):
    """open an app with the diary and the reflector and the given learning overrides"""

    def opener(learning=None, names=("diary", "reflector"), **settings):  # type: ignore[no-untyped-def]
        s = make_settings(learning=learning or PERSIST_ONLY, **settings)
        return _Opened(s, dsn, clock, local_embedder, edge_index, list(names))

    return opener


class _Opened:
    def __init__(self, settings, dsn, clock, embedder, index, names):  # type: ignore[no-untyped-def]
        self._cm = open_app(settings, dsn, names=names, clock=clock, embedder=embedder, index=index)

    async def __aenter__(self) -> Env:
        return Env(await self._cm.__aenter__())

    async def __aexit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        await self._cm.__aexit__(*exc)


BOB_PREFERS = [message("bob", "Thanks! I prefer weekly digests over daily pings.")]


# ------------------------------------------------------------------------------ the queue


async def test_submit_returns_once_queued_and_a_second_submit_is_a_no_op_that_says_so(env_for, clock):
    async with env_for() as env:
        first = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert first.queued and first.state == pb.REFLECTION_STATE_QUEUED
        again = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert not again.queued and again.state == pb.REFLECTION_STATE_QUEUED
        assert await env.harness.drain() == 1
        after = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert not after.queued and after.state == pb.REFLECTION_STATE_COMPLETED
        assert await env.harness.drain() == 0
        assert len(await env.notes()) == 1  # reflected once
        [event] = await read_events(env.app.infra.pool, "turn_completed")
        assert event["turn_id"] == "run-1" and event["payload"]["outcome"] == "TURN_OUTCOME_DONE"


async def test_a_run_id_is_the_seats_own(env_for, clock):
    """Another seat reporting the same run id queues its own reflection: it neither learns the
    first seat's state nor loses its own turn."""
    async with env_for() as env:
        ana = await env.submit(turn("run-1", now=clock.now(), seat="ana", messages=BOB_PREFERS))
        assert await env.harness.drain() == 1
        dan = await env.submit(turn("run-1", now=clock.now(), seat="dan", messages=BOB_PREFERS))
        assert ana.queued and dan.queued and dan.state == pb.REFLECTION_STATE_QUEUED
        assert (await env.reflection("run-1", seat="ana")).state == pb.REFLECTION_STATE_COMPLETED
        assert (await env.reflection("run-1", seat="dan")).state == pb.REFLECTION_STATE_QUEUED
        assert await env.harness.drain() == 1
        assert (await env.reflection("run-1", seat="dan")).state == pb.REFLECTION_STATE_COMPLETED
        assert len(await env.notes("ana")) == len(await env.notes("dan")) == 1
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await env.reflection("run-1", seat="carla")
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda t: t.ClearField("turn_id"), "turn.turn_id"),
        (lambda t: setattr(t, "company", ""), "turn.company"),
        (lambda t: setattr(t, "role", ""), "turn.role"),
        (lambda t: setattr(t, "outcome", pb.TURN_OUTCOME_UNSPECIFIED), "turn.outcome"),
        (lambda t: t.interactions.add(body="hi", sender=pb.Sender(handle="bob")), "turn.interactions[0].sender"),
        # Without its times the turn could have no episode: refused, not accepted and lost later.
        (lambda t: t.ClearField("start_time"), "turn.start_time"),
        (lambda t: t.ClearField("end_time"), "turn.end_time"),
    ],
)
async def test_a_malformed_turn_is_refused_naming_the_field(env_for, clock, mutate, field):
    async with env_for() as env:
        t = turn("run-x", now=clock.now())
        mutate(t)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await env.submit(t)
        code, info, bad = error_info(exc.value)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.field_violations[0].field == field
        assert info.domain == "reflector.agentlearn.dev"
        assert await env.app.infra.pool.fetchval("SELECT count(*) FROM background_jobs") == 0


# ------------------------------------------------------------------------------ the gates


async def _gate(env: Env, t: pb.TurnCompleted) -> pb.Reflection:
    await env.submit(t)
    await env.harness.drain()
    return await env.reflection(t.turn_id, seat=t.seat)


async def test_no_workers_gate(env_for, clock):
    async with env_for(learning={"reflection": {"workers": []}}) as env:
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert (r.state, r.gate) == (pb.REFLECTION_STATE_GATED, "no_workers")


async def test_no_role_gate(env_for, clock):
    async with env_for(company_defaults={"roles": {"swe": {}}}) as env:
        r = await _gate(env, turn("run-1", now=clock.now(), role="pm", messages=BOB_PREFERS))
        assert (r.state, r.gate) == (pb.REFLECTION_STATE_GATED, "no_role")
        ok = await _gate(env, turn("run-2", now=clock.now(), role="swe", messages=BOB_PREFERS))
        assert ok.state == pb.REFLECTION_STATE_COMPLETED


async def test_gate_two_closes_by_default_and_opens_only_when_asked(env_for, clock):
    """accept_unknown_roles is false by default: with no company configuration a role the default
    company does not list (only ``swe``) is gated; ``accept_unknown_roles: true`` takes it."""
    async with env_for() as env:
        r = await _gate(env, turn("run-1", now=clock.now(), role="pm", messages=BOB_PREFERS))
        assert (r.state, r.gate) == (pb.REFLECTION_STATE_GATED, "no_role")
        ok = await _gate(env, turn("run-2", now=clock.now(), role="swe", messages=BOB_PREFERS))
        assert ok.state == pb.REFLECTION_STATE_COMPLETED
    async with env_for(company_defaults={"accept_unknown_roles": True}) as env:
        r = await _gate(env, turn("run-3", now=clock.now(), role="pm", messages=BOB_PREFERS))
        assert r.state == pb.REFLECTION_STATE_COMPLETED


async def test_per_role_opt_out_and_inheritance(env_for, clock):
    roles = {"roles": {"noisy": {"learning_enabled": False}, "keen": {"learning_enabled": True}, "plain": {}}}
    async with env_for(learning={**PERSIST_ONLY, "enabled": False}, company_defaults=roles) as env:
        assert (await _gate(env, turn("r1", now=clock.now(), role="noisy", messages=BOB_PREFERS))).gate == "opted_out"
        assert (await _gate(env, turn("r2", now=clock.now(), role="plain", messages=BOB_PREFERS))).gate == "opted_out"
        kept = await _gate(env, turn("r3", now=clock.now(), role="keen", messages=BOB_PREFERS))
        assert kept.state == pb.REFLECTION_STATE_COMPLETED  # an explicit true beats the company's false


@pytest.mark.parametrize(
    "build",
    [
        lambda now: turn("r", now=now, outcome=pb.TURN_OUTCOME_SKIPPED, messages=BOB_PREFERS),
        lambda now: turn("r", now=now, review_outcome="skipped", messages=BOB_PREFERS),
        lambda now: turn("r", now=now, tools=[], messages=BOB_PREFERS),
    ],
)
async def test_no_engagement_gate(env_for, clock, build):
    async with env_for() as env:
        r = await _gate(env, build(clock.now()))
        assert (r.state, r.gate) == (pb.REFLECTION_STATE_GATED, "no_engagement")
        assert await env.notes() == []


async def test_a_turn_with_a_final_round_engaged_even_when_it_reports_no_calls(env_for, clock):
    """Gate 6 reads the turn's run of tools, not tools_called alone: a done turn whose engine
    reported its final round's tools but no calls did engage (it used to be gated as having called
    nothing)."""
    async with env_for() as env:
        t = turn("r", now=clock.now(), tools=[], final_round=["jira_search"], messages=BOB_PREFERS)
        r = await _gate(env, t)
        assert r.state == pb.REFLECTION_STATE_COMPLETED and r.gate == ""
        assert len(await env.notes()) == 1


async def test_budget_gate_defers_and_the_turn_runs_when_the_window_moves(env_for, clock):
    budget = {"roles": {"swe": {}}, "token_budget": {"seat_ceiling_tokens": 100, "window_hours": 24}}
    async with env_for(company_defaults=budget) as env:
        cfg = env.app.infra.settings.company("acme").token_budget
        await env.app.infra.budget.charge("acme", "ana", 100, clock.now(), cfg)
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert (r.state, r.gate) == (pb.REFLECTION_STATE_DEFERRED, "no_budget")
        assert await env.harness.drain() == 0  # not before its time
        clock.advance(hours=24)
        assert await env.harness.drain() == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_COMPLETED and r.gate == "" and r.attempts == 2
        assert len(await env.notes()) == 1


async def test_an_unreadable_budget_counter_reflects_anyway(env_for, clock):
    budget = {"roles": {"swe": {}}, "token_budget": {"seat_ceiling_tokens": 100}}
    async with env_for(company_defaults=budget) as env:
        await env.app.infra.pool.execute("ALTER TABLE token_spend RENAME TO token_spend_unreachable")
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert r.state == pb.REFLECTION_STATE_COMPLETED


# ------------------------------------------------------------------------------ persist decider


async def test_persist_decider_writes_a_declarative_long_fact(env_for, clock):
    async with env_for() as env:
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        w = env.worker(r, "persist_decider")
        assert w.status == pb.WORKER_STATUS_WROTE and w.detail == "LONG"
        [note] = await env.notes()
        assert note.content == "Bob prefers weekly digests over daily pings."
        assert note.tier == diary_pb.NOTE_TIER_LONG and note.source == diary_pb.NOTE_SOURCE_PERSIST_DECIDER
        assert note.turn_id == "run-1"
        [event] = await read_events(env.app.infra.pool, "persist_decider_completed")
        assert event["payload"]["classification"] == "LONG" and event["payload"]["ttl_until"] is None


async def test_persist_decider_writes_situational_state_as_a_short_declarative_fact_until_its_end(env_for, clock):
    async with env_for() as env:
        today = clock.now().date()
        assert today.day < 20  # the statement below names this month's 20th
        msgs = [message("bob", "Heads up: I'm on vacation until the 20th.")]
        r = await _gate(env, turn("run-1", now=clock.now(), messages=msgs))
        assert env.worker(r, "persist_decider").detail == "SHORT"
        [note] = await env.notes()
        # About Bob, in the agent's words, dated: not a quote of what he said.
        assert note.content == f"Bob is on vacation until the 20th (said {today.isoformat()})."
        assert note.tier == diary_pb.NOTE_TIER_SHORT
        # True through the 20th: it expires when the 21st begins.
        assert note.expire_time.ToDatetime().date() == today.replace(day=21)
        [event] = await read_events(env.app.infra.pool, "persist_decider_completed")
        assert event["payload"]["ttl_until"] is not None


async def test_situational_state_that_already_ended_is_not_noted(env_for, clock):
    """A SHORT note's days count from the turn, not from the reflection: state that stopped being
    true before the turn was reflected (a vacation said a month ago) is not written."""
    async with env_for() as env:
        said = clock.now()
        clock.advance(days=30)
        msgs = [message("bob", "Heads up: I'm out of office this week.")]
        r = await _gate(env, turn("run-1", now=said, messages=msgs))
        w = env.worker(r, "persist_decider")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "already_over")
        assert await env.notes() == []


async def test_the_seats_own_messages_are_not_noted(env_for, clock):
    async with env_for() as env:
        msgs = [message("Ana", "I prefer tabs over spaces."), message("bob", "ok, thanks")]
        r = await _gate(env, turn("run-1", now=clock.now(), messages=msgs))
        assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_NOTHING
        assert await env.notes() == []


async def test_a_long_statement_is_skipped_whole_not_trimmed(env_for, clock):
    """The offline rules keep the writers' one rule: a note past 2,000 characters is skipped and
    logged, never trimmed to fit (it used to be cut at 2,000)."""
    async with env_for() as env:
        long = "I prefer release notes that list " + ", ".join(f"component {i}" for i in range(300))
        r = await _gate(env, turn("run-1", now=clock.now(), messages=[message("bob", long)]))
        w = env.worker(r, "persist_decider")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "note_too_long")
        assert await env.notes() == []


async def test_a_paraphrase_of_a_note_is_a_repeat(env_for, clock):
    async with env_for() as env:
        await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        again = [message("bob", "I'd prefer a weekly digest to daily pings.")]
        r = await _gate(env, turn("run-2", now=clock.now(), messages=again))
        assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_NOTHING
        assert len(await env.notes()) == 1


async def test_persist_decider_logs_doc_and_noop_without_writing(env_for, clock):
    async with env_for() as env:
        doc = await _gate(
            env, turn("run-1", now=clock.now(), messages=[message("bob", "Everyone should rebase before merging.")])
        )
        assert env.worker(doc, "persist_decider").detail.startswith("DOC")
        noop = await _gate(env, turn("run-2", now=clock.now(), messages=[message("bob", "ok, thanks")]))
        assert env.worker(noop, "persist_decider").status == pb.WORKER_STATUS_NOTHING
        assert await env.notes() == []


@pytest.mark.parametrize(
    ("kw", "gate"),
    [({"outcome": pb.TURN_OUTCOME_SELF_ITERATE}, "unsettled"), ({"self_persisted": True}, "self_persisted")],
)
async def test_persist_decider_stays_out_of_unsettled_and_self_persisted_turns(env_for, clock, kw, gate):
    async with env_for() as env:
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS, **kw))
        w = env.worker(r, "persist_decider")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, gate)
        assert await env.notes() == []


async def test_persist_decider_does_not_repeat_a_note(env_for, clock):
    async with env_for() as env:
        await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        r = await _gate(env, turn("run-2", now=clock.now(), messages=BOB_PREFERS))
        assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_NOTHING
        assert len(await env.notes()) == 1


# ------------------------------------------------------------------------------ with a model


def scripted_chain(server):  # type: ignore[no-untyped-def]
    return {
        "llm": {
            "model": {
                "kind": "openai",
                "base_url": server.base_url,
                "api_key": "k",
                "model": "m",
                "timeout_seconds": 1.0,
            }
        },
        "auxiliary_chain": ["model"],
    }


async def test_the_decider_is_shown_recent_notes_and_the_writing_rule(env_for, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: json.dumps({"classification": "NOOP"})
    async with env_for(providers=scripted_chain(scripted_openai)) as env:
        await env.diary.WriteNote(
            diary_pb.WriteNoteRequest(
                company="acme", seat="ana", tier=diary_pb.NOTE_TIER_LONG, content="Carla owns the billing service"
            )
        )
        await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        [call] = scripted_openai.received("chat")
        system, user = call["messages"][0]["content"], call["messages"][1]["content"]
        assert "declarative facts, not instructions" in system
        assert "Carla owns the billing service" in user
        assert "Woken by: Message from Bob: Slack message" in user and "What it did:" in user
        assert "Bob (slack): Thanks! I prefer weekly digests" in user


async def test_a_note_past_two_thousand_characters_is_skipped_and_logged(env_for, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: json.dumps({"classification": "LONG", "content": "x" * 2001})
    async with env_for(providers=scripted_chain(scripted_openai)) as env:
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        w = env.worker(r, "persist_decider")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "note_too_long")
        assert await env.notes() == []


async def test_a_final_model_failure_is_recorded_by_kind_and_writes_nothing(env_for, clock, scripted_openai):
    """Output a model gave that cannot be used is an answer: the worker's outcome, final."""
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "{not json"}, "finish_reason": "stop"}],
        "model": "m",
        "id": "x",
        "object": "chat.completion",
        "created": 0,
    }
    scripted_openai.push("chat", Reply(body=body))
    async with env_for(providers=scripted_chain(scripted_openai)) as env:
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        w = env.worker(r, "persist_decider")
        assert w.status == pb.WORKER_STATUS_FAILED and w.failure.startswith("invalid_output")
        assert r.state == pb.REFLECTION_STATE_COMPLETED  # the pass completes its record
        assert await env.notes() == []
        [event] = await read_events(env.app.infra.pool, "reflection_completed")
        assert event["payload"]["failures"]["persist_decider"].startswith("invalid_output")
        clock.advance(hours=1)
        assert await env.harness.drain() == 0  # never run again


@pytest.mark.parametrize(
    ("reply", "kind"),
    [(Reply(status=429), "rate_limited"), (Reply(status=500), "server_error"), (Reply(delay=2.0), "timeout")],
)
async def test_a_passing_model_failure_is_retried_with_backoff_not_recorded_final(
    env_for, clock, scripted_openai, reply, kind
):
    scripted_openai.chat_handler = lambda body: json.dumps(
        {"classification": "LONG", "content": "Bob prefers weekly digests.", "reason": "said"}
    )
    scripted_openai.push("chat", reply)
    async with env_for(providers=scripted_chain(scripted_openai)) as env:
        submitted = clock.now()
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        w = env.worker(r, "persist_decider")
        assert w.status == pb.WORKER_STATUS_RETRYING and w.failure.startswith(kind)
        assert r.state == pb.REFLECTION_STATE_RETRYING and r.reason.startswith(f"persist_decider: {kind}")
        assert r.next_attempt_time.ToDatetime(tzinfo=submitted.tzinfo) == submitted + timedelta(seconds=15)
        assert await read_events(env.app.infra.pool, "reflection_completed") == []
        [retrying] = await read_events(env.app.infra.pool, "reflection_retrying")
        assert retrying["payload"]["attempts"] == 1
        again = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert not again.queued and again.state == pb.REFLECTION_STATE_RETRYING
        assert await env.harness.drain() == 0  # not before its time
        clock.advance(seconds=15)
        assert await env.harness.drain() == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_COMPLETED and r.attempts == 2 and r.reason == ""
        assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_WROTE
        assert [n.content for n in await env.notes()] == ["Bob prefers weekly digests."]


async def test_a_turn_still_failing_after_max_attempts_is_dead_lettered_with_its_reason(
    env_for, clock, scripted_openai
):
    scripted_openai.rule("chat", lambda body: Reply(status=503))
    learning = {"reflection": {"workers": ["persist_decider"], "max_attempts": 3, "retry_backoff_seconds": 10}}
    async with env_for(learning=learning, providers=scripted_chain(scripted_openai)) as env:
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        waits = []
        for _ in range(3):
            assert await env.harness.drain() == 1
            r = await env.reflection("run-1")
            if r.state == pb.REFLECTION_STATE_RETRYING:
                waits.append(r.next_attempt_time.ToDatetime(tzinfo=clock.now().tzinfo) - clock.now())
                clock.set(r.next_attempt_time.ToDatetime(tzinfo=clock.now().tzinfo))
        assert waits == [timedelta(seconds=10), timedelta(seconds=20)]  # doubling
        assert r.state == pb.REFLECTION_STATE_DEAD_LETTERED and r.attempts == 3
        assert r.reason.startswith("gave up after 3 attempts: persist_decider: server_error")
        w = env.worker(r, "persist_decider")
        assert w.status == pb.WORKER_STATUS_FAILED and w.failure.startswith("server_error")
        assert len(scripted_openai.received("chat")) == 3
        [dead] = await read_events(env.app.infra.pool, "reflection_dead_lettered")
        assert dead["payload"]["reason"] == r.reason and dead["turn_id"] == "run-1"
        job = await env.app.infra.pool.fetchrow("SELECT state, reason FROM background_jobs")
        assert (job["state"], job["reason"]) == ("dead", r.reason)
        clock.advance(days=1)
        assert await env.harness.drain() == 0
        again = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert not again.queued and again.state == pb.REFLECTION_STATE_DEAD_LETTERED
        assert await env.notes() == []
        # The cause fixed, an operator runs the dead letters again (docs/services/reflector.md).
        scripted_openai.rule("chat", None)
        scripted_openai.chat_handler = lambda body: json.dumps(
            {"classification": "LONG", "content": "Bob prefers weekly digests.", "reason": "said"}
        )
        await env.app.infra.pool.execute(
            "UPDATE background_jobs SET state = 'queued', attempts = 0, run_after = $1 "
            "WHERE kind = 'reflection' AND state = 'dead'",
            clock.now(),
        )
        assert await env.harness.drain() == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_COMPLETED and r.reason == ""
        assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_WROTE
        assert len(await env.notes()) == 1


async def test_a_service_down_is_retried_and_only_the_unfinished_worker_runs_again(env_for, clock):
    """The episodes service is unreachable on the first attempt: the episodist is left retrying
    while the persist decider finishes; on the next attempt only the episodist runs."""
    learning = {"reflection": {"workers": ["persist_decider", "episodist"], "rpc_timeout_seconds": 5}}
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        async with env_for(learning=learning, names=["diary", "episodes", "reflector"]) as env:
            env.app.infra.channels.serve_locally(["episodes"], f"127.0.0.1:{dead.getsockname()[1]}")
            r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
            assert r.state == pb.REFLECTION_STATE_RETRYING
            assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_WROTE
            episodist = env.worker(r, "episodist")
            assert episodist.status == pb.WORKER_STATUS_RETRYING and episodist.failure.startswith("rpc_unavailable")
            assert r.reason.startswith("episodist: rpc_unavailable")
            env.app.infra.channels.serve_locally(["episodes"], f"127.0.0.1:{env.app.port}")  # it is back
            clock.advance(seconds=15)
            assert await env.harness.drain() == 1
            r = await env.reflection("run-1")
            assert r.state == pb.REFLECTION_STATE_COMPLETED and r.attempts == 2
            assert [w.worker for w in r.workers] == ["persist_decider", "episodist"]  # in the order they ran
            assert env.worker(r, "episodist").status == pb.WORKER_STATUS_WROTE
            assert await env.app.infra.pool.fetchval("SELECT count(*) FROM episodes") == 1
            spends = await read_events(env.app.infra.pool, "auxiliary_spend")
            assert [e["payload"]["purpose"] for e in spends] == ["persist_decider"]  # it did not run again
            assert len(await env.notes()) == 1


async def test_on_resume_a_retryable_failure_runs_again_and_a_finished_worker_does_not(env_for, clock):
    """A pass stopped mid-way (its claim lapsed) had recorded the persist decider FAILED with a
    retryable kind (as a drain's self-call did before retries existed) and the episodist WROTE: the
    resumed pass runs the persist decider again and leaves the episodist's outcome as it is."""
    learning = {"reflection": {"workers": ["persist_decider", "episodist"], "claim_lease_seconds": 30}}
    async with env_for(learning=learning, names=["diary", "episodes", "reflector"]) as env:
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        pool = env.app.infra.pool
        job = await JobQueue(pool).claim("reflection", "crashed-worker", clock.now(), 30)
        recorded = [
            {"worker": "persist_decider", "status": "failed", "failure": "rpc_unavailable: failed to connect"},
            {"worker": "episodist", "status": "wrote", "written": ["episode:recorded-before"]},
        ]
        await pool.execute(
            "UPDATE reflections SET state = 'running', workers = $1::jsonb, attempts = 1", json.dumps(recorded)
        )
        assert job is not None and await env.harness.drain() == 0  # still held
        clock.advance(seconds=31)  # the crashed worker's claim lapsed
        assert await env.harness.drain() == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_COMPLETED and r.attempts == 2
        assert env.worker(r, "persist_decider").status == pb.WORKER_STATUS_WROTE
        assert list(env.worker(r, "episodist").written) == ["episode:recorded-before"]
        assert await pool.fetchval("SELECT count(*) FROM episodes") == 0  # not run again
        assert len(await env.notes()) == 1


async def test_reflection_calls_are_charged_to_the_seat_as_reflection_stage(env_for, clock):
    async with env_for() as env:
        await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        [spend] = await read_events(env.app.infra.pool, "auxiliary_spend")
        assert spend["payload"]["stage"] == "reflection" and spend["payload"]["purpose"] == "persist_decider"
        assert spend["turn_id"] == "run-1" and spend["seat"] == "ana"
        spent = await env.app.infra.pool.fetchval("SELECT tokens FROM token_spend WHERE seat = 'ana'")
        assert spent > 0


# ------------------------------------------------------------------------------ reads


async def test_reflections_page_and_stay_with_their_seat(env_for, clock):
    async with env_for() as env:
        for i in range(5):
            clock.advance(seconds=1)
            await env.submit(turn(f"run-{i}", now=clock.now(), messages=BOB_PREFERS))
        await env.harness.drain()
        seen, token = [], ""
        while True:
            page = await env.stub.ListReflections(
                pb.ListReflectionsRequest(company="acme", seat="ana", page_size=2, page_token=token)
            )
            assert page.total_size == 5
            seen += [r.turn_id for r in page.reflections]
            token = page.next_page_token
            if not token:
                break
        assert seen == [f"run-{i}" for i in reversed(range(5))]
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await env.reflection("run-1", seat="bob")
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_offline_decider_keeps_the_most_durable_thing_said():
    from services.reflector.workers.persist_decider import offline_rule

    data = {
        "interactions": [
            {
                "sender": "Carla",
                "body": "Let's ship the retry fix today. Please never merge to main without a green staging run.",
            }
        ]
    }
    answer = json.loads(offline_rule(data))
    assert answer == {
        "classification": "LONG",
        "reason": "stated in the turn",
        "content": "Carla does not want anyone to merge to main without a green staging run.",
    }
    filler = json.loads(
        offline_rule({"interactions": [{"sender": "Bob", "body": "I prefer weekly digests, by the way."}]})
    )
    assert filler["content"] == "Bob prefers weekly digests."


@pytest.mark.parametrize(
    ("said", "note"),
    [
        (
            "Please always tag the security channel before merging.",
            "Carla expects ana to tag the security channel before merging every time.",
        ),
        ("We use trunk-based development, so keep branches short-lived.", "Carla's team uses trunk-based development."),
        ("I'd like you to send me a digest on Fridays.", "Carla would like ana to send Carla a digest on Fridays."),
        ("The sprint freeze runs through 2026-05-10.", "The sprint freeze runs through 2026-05-10 (said 2026-05-01)."),
    ],
)
def test_the_offline_decider_writes_declarative_facts_not_instructions_or_quotes(said, note):
    from services.reflector.workers.persist_decider import offline_rule

    data = {"seat": "ana", "end_time": "2026-05-01T10:00:00+00:00", "interactions": [{"sender": "Carla", "body": said}]}
    assert json.loads(offline_rule(data))["content"] == note


async def test_the_opt_out_decision_rides_on_the_event(env_for, clock):
    roles = {"roles": {"swe": {}, "noisy": {"learning_enabled": False}}}
    async with env_for(company_defaults=roles) as env:
        t = turn("run-1", now=clock.now(), role="noisy", messages=BOB_PREFERS)
        t.learning_enabled = True  # the role was opted in when the turn ran; the config changed since
        assert (await _gate(env, t)).state == pb.REFLECTION_STATE_COMPLETED
        t2 = turn("run-2", now=clock.now(), messages=BOB_PREFERS)
        t2.learning_enabled = False
        assert (await _gate(env, t2)).gate == "opted_out"


async def test_a_worker_that_loses_its_claim_stops(env_for, clock, scripted_openai):
    """The claim is stolen (another worker took the lapsed turn) while a slow model call runs: the
    renewal fails and the pass stops; it neither completes the record nor writes."""
    import asyncio

    scripted_openai.rule("chat", lambda body: Reply(delay=3.0))
    learning = {"reflection": {"workers": ["persist_decider"], "claim_lease_seconds": 0.3}}
    async with env_for(learning=learning, providers=scripted_chain(scripted_openai)) as env:
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        draining = asyncio.create_task(env.harness.drain())
        pool = env.app.infra.pool
        async with asyncio.timeout(10):
            while not scripted_openai.received("chat"):  # the worker is inside its model call
                await asyncio.sleep(0.02)
        await pool.execute("UPDATE background_jobs SET locked_by = 'another-worker'")
        async with asyncio.timeout(10):
            assert await draining == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_RUNNING and list(r.workers) == []
        assert await env.notes() == []


async def test_a_worker_that_stops_hands_its_turn_back_at_once(env_for, clock, scripted_openai):
    """Cancelled mid-pass (the process stopping cleanly), the worker puts the turn back on the queue
    with its attempt given back, so the next process takes it without waiting out the lease."""
    import asyncio

    scripted_openai.rule("chat", lambda body: Reply(delay=5.0))
    providers = scripted_chain(scripted_openai)
    providers["llm"]["model"]["timeout_seconds"] = 30.0
    learning = {"reflection": {"workers": ["persist_decider"], "claim_lease_seconds": 300}}
    async with env_for(learning=learning, providers=providers) as env:
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        draining = asyncio.create_task(env.harness.drain())
        async with asyncio.timeout(10):
            while not scripted_openai.received("chat"):  # the worker is inside its model call
                await asyncio.sleep(0.02)
        draining.cancel()
        with pytest.raises(asyncio.CancelledError):
            await draining
        job = await env.app.infra.pool.fetchrow("SELECT state, attempts, locked_by FROM background_jobs")
        assert (job["state"], job["attempts"], job["locked_by"]) == ("queued", 0, None)
        assert (await env.reflection("run-1")).state == pb.REFLECTION_STATE_QUEUED
        scripted_openai.rule("chat", None)
        scripted_openai.chat_handler = lambda body: json.dumps(
            {"classification": "LONG", "content": "Bob prefers weekly digests.", "reason": "said"}
        )
        assert await env.harness.drain() == 1  # at once: the lease of 300 s is not waited out
        assert (await env.reflection("run-1")).state == pb.REFLECTION_STATE_COMPLETED
        assert len(await env.notes()) == 1


async def test_the_episodist_takes_a_run_id_out_of_a_label():
    from services.reflector.convert import turn_from_pb
    from services.reflector.workers.episodist import _label

    t = turn_from_pb(
        turn("fire-8841", now=datetime(2026, 1, 1, tzinfo=UTC), label="Scheduled: weekly-report fire-8841")
    )
    assert _label(t) == "Scheduled: weekly-report"


async def test_a_turn_asked_more_than_its_episode_can_hold_is_refused_at_submit(env_for, clock):
    """Each body fits the contract, but their sum would be refused by RecordEpisode later and the
    episode lost: SubmitTurn refuses it instead, naming the field and the limit."""
    from services.reflector.service import MAX_ASKED_CHARS

    async with env_for() as env:
        bodies = [message("bob", "x" * 30_000) for _ in range(4)]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.submit(turn("too-much", now=clock.now(), messages=bodies))
        code, info, bad = error_info(err.value)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_TOO_LONG"
        assert info.metadata["limit"] == str(MAX_ASKED_CHARS)
        assert bad.field_violations[0].field == "turn.interactions"
        assert await env.app.infra.pool.fetchval("SELECT count(*) FROM reflections") == 0


async def test_one_long_message_is_a_turn_like_any_other(env_for, clock):
    """A single message may be as long as the turn's whole asked text (a pasted log, a long issue):
    it was refused past 32,000 characters though the episode holds 100,000, and the whole turn was
    lost to learning with it."""
    async with env_for(
        names=("diary", "episodes", "reflector"), learning={"reflection": {"workers": ["episodist"]}}
    ) as env:
        body = ("the deploy log says " + "step ok; " * 5_000)[:45_000]
        resp = await env.submit(turn("long-1", now=clock.now(), messages=[message("bob", body)], tools=["read_log"]))
        assert resp.queued
        assert await env.harness.drain() == 1
        row = await env.app.infra.pool.fetchrow("SELECT ask FROM episodes WHERE turn_id = 'long-1'")
        assert row is not None and row["ask"] == body


# ------------------------------------------------------------------------------ side by side

NOOP_FOR_ANY_WORKER = json.dumps({"classification": "NOOP", "reason": "nothing durable", "noop": True})


def _slow_chain(server):  # type: ignore[no-untyped-def]
    providers = scripted_chain(server)
    providers["llm"]["model"]["timeout_seconds"] = 20.0
    return providers


def _meet(expected: int, seen: list, met: list):  # type: ignore[no-untyped-def]
    """A model rule that holds each request until ``expected`` requests are in flight at once (or
    8 s pass); ``met`` records, per request, whether they were."""
    import threading

    all_in = threading.Event()
    lock = threading.Lock()

    def rule(body):  # type: ignore[no-untyped-def]
        with lock:
            seen.append(body["messages"][0]["content"][:40])
            if len(seen) >= expected:
                all_in.set()
        met.append(all_in.wait(timeout=8))
        return None

    return rule


async def test_a_turns_workers_run_side_by_side(env_for, clock, scripted_openai):
    """The persist decider's and the profiler's model calls are in flight at the same time: each is
    held until the other arrives (run one after the other, the first would wait alone)."""
    seen: list = []
    met: list = []
    scripted_openai.rule("chat", _meet(2, seen, met))
    scripted_openai.chat_handler = lambda body: NOOP_FOR_ANY_WORKER
    learning = {"reflection": {"workers": ["persist_decider", "profiler"]}}
    async with env_for(learning=learning, providers=_slow_chain(scripted_openai)) as env:
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert r.state == pb.REFLECTION_STATE_COMPLETED
        assert len(seen) == 2 and met == [True, True]
        assert [w.worker for w in r.workers] == ["persist_decider", "profiler"]  # the configured order
        assert [w.status for w in r.workers] == [pb.WORKER_STATUS_NOTHING, pb.WORKER_STATUS_NOTHING]


async def test_turns_are_reflected_side_by_side_up_to_the_concurrency(env_for, clock, scripted_openai):
    """Two queued turns, concurrency 2: one drain claims both and their model calls overlap."""
    seen: list = []
    met: list = []
    scripted_openai.rule("chat", _meet(2, seen, met))
    scripted_openai.chat_handler = lambda body: NOOP_FOR_ANY_WORKER
    learning = {"reflection": {"workers": ["persist_decider"], "concurrency": 2}}
    async with env_for(learning=learning, providers=_slow_chain(scripted_openai)) as env:
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        await env.submit(turn("run-2", now=clock.now(), messages=BOB_PREFERS))
        assert await env.harness.drain() == 2
        assert met == [True, True]
        for run in ("run-1", "run-2"):
            assert (await env.reflection(run)).state == pb.REFLECTION_STATE_COMPLETED


async def test_a_long_pass_records_the_workers_that_finished_before_it_ends(env_for, clock, scripted_openai):
    """The persist decider's model call takes seconds; the episodist's outcome is in the record while
    the pass still runs (a crash then would not redo it), and the pass ends with both."""
    import asyncio

    from tests.support.scripted_openai import Reply

    scripted_openai.rule("chat", lambda body: Reply(delay=4.0))
    scripted_openai.chat_handler = lambda body: NOOP_FOR_ANY_WORKER
    # A lease of 6 s: what finished is recorded every second (a sixth of the lease).
    learning = {"reflection": {"workers": ["persist_decider", "episodist"], "claim_lease_seconds": 6}}
    async with env_for(
        learning=learning, names=["diary", "episodes", "reflector"], providers=_slow_chain(scripted_openai)
    ) as env:
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        draining = asyncio.create_task(env.harness.drain())
        async with asyncio.timeout(15):
            while not (r := await env.reflection("run-1")).workers:
                await asyncio.sleep(0.05)
        assert r.state == pb.REFLECTION_STATE_RUNNING
        assert [(w.worker, w.status) for w in r.workers] == [("episodist", pb.WORKER_STATUS_WROTE)]
        assert not draining.done()
        assert await draining == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_COMPLETED
        assert [w.worker for w in r.workers] == ["persist_decider", "episodist"]  # the configured order


# ------------------------------------------------------------------------------ one state machine


async def _out_of_step(pool) -> list:  # type: ignore[no-untyped-def]
    """Records whose queue row is not in the state the record's state implies (issue 13)."""
    rows = await pool.fetch(
        "SELECT r.seat, r.turn_id, r.state, j.state AS job_state FROM reflections r JOIN background_jobs j"
        " ON j.kind = 'reflection' AND j.company = r.company AND j.key = r.seat || '/' || r.turn_id"
    )
    assert rows, "no reflection with its queue row"
    return [dict(r) for r in rows if ReflectionState(r["state"]).job_state != r["job_state"]]


async def test_the_queue_row_moves_with_the_record_through_every_pass(env_for, clock, scripted_openai):
    """Gated, retried, deferred-free completion and dead-lettering: after each pass the queue row
    is in the state the record's state implies (one state, two rows written together)."""
    scripted_openai.rule("chat", lambda body: Reply(status=503))
    learning = {"reflection": {"workers": ["persist_decider"], "max_attempts": 2, "retry_backoff_seconds": 10}}
    async with env_for(learning=learning, providers=scripted_chain(scripted_openai)) as env:
        pool = env.app.infra.pool
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        await env.submit(turn("run-2", now=clock.now(), outcome=pb.TURN_OUTCOME_SKIPPED, messages=BOB_PREFERS))
        assert await _out_of_step(pool) == []
        assert await env.harness.drain() == 2
        states = {r: (await env.reflection(r)).state for r in ("run-1", "run-2")}
        assert states == {"run-1": pb.REFLECTION_STATE_RETRYING, "run-2": pb.REFLECTION_STATE_GATED}
        assert await _out_of_step(pool) == []
        clock.advance(seconds=10)
        assert await env.harness.drain() == 1
        assert (await env.reflection("run-1")).state == pb.REFLECTION_STATE_DEAD_LETTERED
        assert await _out_of_step(pool) == []


async def test_a_finished_record_is_not_taken_again_and_moving_it_is_refused(env_for, clock):
    async with env_for() as env:
        pool = env.app.infra.pool
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        queue, store = JobQueue(pool), PostgresReflectionStore(pool)
        [job] = await queue.claim_many("reflection", "w-1", clock.now(), 30, 5)
        key = TurnKey("acme", "ana", "run-1")
        # Taken and finished (both rows move).
        record, taken = await store.take(*key)
        assert record is not None and record.state == ReflectionState.QUEUED and taken
        assert await store.finish_and_close(job, "w-1", key, ReflectionState.COMPLETED, None, clock.now(), [])
        assert await _out_of_step(pool) == []
        # A finished record is not taken again (the duplicate gate), and moving it is refused.
        record, taken = await store.take("acme", "ana", "run-1")
        assert record is not None and record.state == ReflectionState.COMPLETED and not taken
        with pytest.raises(IllegalTransition):
            async with pool.acquire() as conn, conn.transaction():
                await store.retrying(conn, TurnKey("acme", "ana", "run-1"), "late", clock.now())
        assert (await env.reflection("run-1")).state == pb.REFLECTION_STATE_COMPLETED


async def test_the_job_finishes_and_the_record_closes_in_one_statement_both_or_neither(env_for, clock):
    """``finish_and_close`` (the harness's end of a pass): a refused close moves neither row, a
    stale claim moves nothing, and a record that is gone lets the job finish alone."""
    async with env_for() as env:
        pool = env.app.infra.pool
        for run in ("run-1", "run-2"):
            await env.submit(turn(run, now=clock.now(), messages=BOB_PREFERS))
        queue, store = JobQueue(pool), PostgresReflectionStore(pool)
        jobs = {j.key.split("/")[1]: j for j in await queue.claim_many("reflection", "w-1", clock.now(), 30, 5)}
        key, outcomes = TurnKey("acme", "ana", "run-1"), [WorkerOutcome("persist_decider", WorkerStatus.WROTE)]
        job_state = "SELECT state FROM background_jobs WHERE id = $1"
        # Claimed but never taken: QUEUED -> COMPLETED is not a move, and the job stays with it.
        with pytest.raises(IllegalTransition) as exc:
            await store.finish_and_close(jobs["run-1"], "w-1", key, ReflectionState.COMPLETED, None, clock.now())
        assert (exc.value.current, exc.value.target) == (ReflectionState.QUEUED, ReflectionState.COMPLETED)
        assert await pool.fetchval(job_state, jobs["run-1"].id) == "running"
        await store.take(*key)
        # Another holder's claim (a stale one) moves nothing.
        assert not await store.finish_and_close(jobs["run-1"], "w-2", key, ReflectionState.COMPLETED, None, clock.now())
        assert (await env.reflection("run-1")).state == pb.REFLECTION_STATE_RUNNING
        # The holder's: both move, with the pass's outcomes.
        assert await store.finish_and_close(
            jobs["run-1"], "w-1", key, ReflectionState.COMPLETED, None, clock.now(), outcomes
        )
        assert await pool.fetchval(job_state, jobs["run-1"].id) == "done"
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_COMPLETED and env.worker(r, "persist_decider").status
        # Done once: the same claim cannot finish it again.
        assert not await store.finish_and_close(jobs["run-1"], "w-1", key, ReflectionState.GATED, "x", clock.now())
        # A record that is gone: the job finishes alone.
        await pool.execute("DELETE FROM reflections WHERE turn_id = 'run-2'")
        gone = TurnKey("acme", "ana", "run-2")
        assert await store.finish_and_close(jobs["run-2"], "w-1", gone, ReflectionState.GATED, "no_role", clock.now())
        assert await pool.fetchval(job_state, jobs["run-2"].id) == "done"


async def test_an_unreadable_turn_is_dead_lettered_on_its_record_too(env_for, clock):
    async with env_for() as env:
        pool = env.app.infra.pool
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        await pool.execute("UPDATE background_jobs SET payload = '\\xff'::bytea")
        assert await env.harness.drain() == 1
        r = await env.reflection("run-1")
        assert r.state == pb.REFLECTION_STATE_DEAD_LETTERED and r.reason.startswith("unreadable")
        assert await _out_of_step(pool) == []


async def test_a_turn_still_waiting_past_the_records_retention_keeps_its_record_and_is_reflected(env_for, clock):
    """The records prune takes finished records only, as it takes finished jobs: a turn deferred by
    its budget past ``reflection_max_age_days`` lost its record and, a pass reading a missing record
    as an erasure, was closed unreflected when its window came."""
    budget = {"roles": {"swe": {}}, "token_budget": {"seat_ceiling_tokens": 100, "window_hours": 24}}
    async with env_for(company_defaults=budget, privacy={"retention": {"reflection_max_age_days": 1}}) as env:
        cfg = env.app.infra.settings.company("acme").token_budget
        await env.app.infra.budget.charge("acme", "ana", 100, clock.now(), cfg)
        r = await _gate(env, turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert (r.state, r.gate) == (pb.REFLECTION_STATE_DEFERRED, "no_budget")
        clock.advance(hours=25)
        assert await erasure.prune_retention(env.app.infra.pool, env.app.infra.settings.privacy, clock.now()) == 0
        await env.harness.drain()
        assert len(await env.notes()) == 1
