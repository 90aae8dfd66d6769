"""The triggers of spec/session-learning.txt, each over real gRPC on real Postgres: plan steps newly
done, the whole plan complete, proposals / repeats / stale writes, substantial successful turns
(and the work a check already covered), the manual check's reuse; plus ownership, idempotent
appends and the one transaction of a plan save and its check."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import grpc
import pytest

from agentlearn.sessions.v1 import session_service_pb2 as pb
from libs.common.outcomes import TurnOutcome
from services.sessions.domain import EventKind
from tests.support.sessions import (
    assistant,
    info,
    open_sessions,
    result,
    results,
    step,
    tool_request,
    turn_end,
    user,
)

DONE, PENDING, PROPOSED, SKIPPED, IN_PROGRESS = (
    pb.STEP_STATUS_DONE,
    pb.STEP_STATUS_PENDING,
    pb.STEP_STATUS_PROPOSED,
    pb.STEP_STATUS_SKIPPED,
    pb.STEP_STATUS_IN_PROGRESS,
)


@pytest.fixture
async def env(make_settings, dsn, edge_index, clock):
    settings = make_settings(
        companies={"acme": {"users": {"erin": {"default_workspace": "erin-space"}}}},
    )
    async with open_sessions(settings, dsn, clock=clock, embedder=None, index=edge_index) as env:
        yield env


async def _start(env, clock, session="s1"):
    return await env.append(session, user(f"{session}-hello", "let's begin", clock.now()))


# ------------------------------------------------------------------------------------- plans


async def test_steps_newly_done_queue_one_check_per_revision_however_many(env, clock):
    await _start(env, clock)
    first = await env.plan("s1", 1, step("a", PENDING), step("b", PENDING), step("c", PENDING))
    assert not first.HasField("queued_check") and list(first.newly_done_step_ids) == []
    clock.advance(minutes=1)
    two = await env.plan("s1", 2, step("a", DONE), step("b", DONE), step("c", PENDING))
    assert sorted(two.newly_done_step_ids) == ["a", "b"]
    assert two.queued_check.trigger == pb.CHECK_TRIGGER_PLAN_STEPS_DONE
    assert two.queued_check.plan_revision == 2 and two.queued_check.state == pb.CHECK_STATE_QUEUED
    checks = await env.checks("s1")
    assert [c.check_id for c in checks] == [two.queued_check.check_id]  # one check for two steps


async def test_repeated_statuses_and_proposals_trigger_nothing(env, clock):
    await _start(env, clock)
    proposal = await env.plan("s1", 1, step("a", PROPOSED), step("b", PROPOSED))
    assert not proposal.HasField("queued_check")
    done = await env.plan("s1", 2, step("a", DONE), step("b", IN_PROGRESS))
    assert done.HasField("queued_check")
    again = await env.plan("s1", 3, step("a", DONE), step("b", IN_PROGRESS))  # the same statuses again
    assert not again.HasField("queued_check") and list(again.newly_done_step_ids) == []
    renamed = await env.plan("s1", 4, step("a", DONE, "renamed"), step("b", PENDING))
    assert not renamed.HasField("queued_check")
    assert len(await env.checks("s1")) == 1


async def test_the_whole_plan_complete_replaces_the_final_step_check(env, clock):
    await _start(env, clock)
    await env.plan("s1", 1, step("a", DONE), step("b", PENDING), step("c", PENDING))
    clock.advance(minutes=1)
    final = await env.plan("s1", 2, step("a", DONE), step("b", SKIPPED), step("c", DONE))
    assert final.plan_complete and list(final.newly_done_step_ids) == ["c"]
    assert final.queued_check.trigger == pb.CHECK_TRIGGER_PLAN_COMPLETED
    checks = await env.checks("s1")
    assert [c.trigger for c in checks] == [pb.CHECK_TRIGGER_PLAN_COMPLETED, pb.CHECK_TRIGGER_PLAN_STEPS_DONE]
    resaved = await env.plan("s1", 3, step("a", DONE), step("b", SKIPPED), step("c", DONE))
    assert resaved.plan_complete and not resaved.HasField("queued_check")


async def test_a_plan_completed_by_skipping_its_last_step_is_the_completion_milestone(env, clock):
    await _start(env, clock)
    await env.plan("s1", 1, step("a", DONE), step("b", PENDING))
    clock.advance(minutes=1)
    skipped = await env.plan("s1", 2, step("a", DONE), step("b", SKIPPED))
    assert skipped.queued_check.trigger == pb.CHECK_TRIGGER_PLAN_COMPLETED
    all_skipped = await env.plan("s1", 3, step("a", SKIPPED), step("b", SKIPPED))
    assert not all_skipped.plan_complete and not all_skipped.HasField("queued_check")  # no done step


async def test_a_stale_revision_is_refused_and_triggers_nothing(env, clock):
    await _start(env, clock)
    await env.plan("s1", 5, step("a", PENDING))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.plan("s1", 4, step("a", DONE))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    found = info(err.value)
    assert found.reason == "STALE_PLAN_REVISION" and found.metadata["current_revision"] == "5"
    with pytest.raises(grpc.aio.AioRpcError) as same:
        await env.plan("s1", 5, step("a", DONE))  # the latest revision with other steps: stale too
    assert info(same.value).reason == "STALE_PLAN_REVISION"
    retry = await env.plan("s1", 5, step("a", PENDING))  # the same write again: idempotent
    assert retry.already_saved and not retry.HasField("queued_check")
    assert await env.checks("s1") == []


async def test_a_plan_save_and_its_check_commit_in_one_transaction(env, clock, dsn):
    await _start(env, clock)
    saved = await env.plan("s1", 1, step("a", DONE))
    conn = await asyncpg.connect(dsn)
    try:
        plan_tx = await conn.fetchval("SELECT xmin::text FROM session_plans WHERE session_id = 's1' AND revision = 1")
        check_tx = await conn.fetchval(
            "SELECT xmin::text FROM learning_checks WHERE id = $1::uuid", saved.queued_check.check_id
        )
        job = await conn.fetchrow("SELECT xmin::text AS tx, kind, state FROM background_jobs WHERE key = 'plan:s1:1'")
    finally:
        await conn.close()
    assert job["kind"] == "learning" and job["state"] == "queued"
    assert plan_tx == check_tx == job["tx"]  # written by the same transaction


async def test_plan_steps_are_validated(env, clock):
    await _start(env, clock)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.plan("s1", 1, step("a", DONE), step("a", PENDING))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info(err.value).reason == "DUPLICATE_STEP_ID"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.plan("s1", 1, pb.PlanStep(id="x", title="no status"))
    assert info(err.value).metadata["field"] == "steps[0].status"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.plan("s1", 0, step("a", DONE))
    assert info(err.value).metadata["field"] == "revision"


# ------------------------------------------------------------------------------------- turns


async def test_six_tool_results_make_a_successful_turn_substantial(env, clock):
    t = clock.now()
    five = await env.append("s1", user("u", "go", t), *results("r", 5, t), turn_end("end", t + timedelta(seconds=30)))
    assert list(five.queued_checks) == []
    six = await env.append("s2", user("u", "go", t), *results("r", 6, t), turn_end("end", t + timedelta(seconds=30)))
    (check,) = six.queued_checks
    assert check.trigger == pb.CHECK_TRIGGER_SUBSTANTIAL_TURN and check.turn_id == "t1"
    assert check.trigger_event_id == "end"


async def test_two_minutes_with_a_recorded_result_make_a_turn_substantial(env, clock):
    t = clock.now()
    one = await env.append(
        "s1", user("u", "go", t), result("r", "bash", "ok", t), turn_end("end", t + timedelta(minutes=2))
    )
    assert len(one.queued_checks) == 1
    none = await env.append(
        "s2", user("u", "go", t), assistant("a", "thinking", t), turn_end("end", t + timedelta(minutes=10))
    )
    assert list(none.queued_checks) == []  # long, but no recorded result
    short = await env.append(
        "s3", user("u", "go", t), result("r", "bash", "ok", t), turn_end("end", t + timedelta(seconds=119))
    )
    assert list(short.queued_checks) == []


async def test_failed_or_cancelled_turns_trigger_nothing(env, clock):
    t = clock.now()
    failed = await env.append(
        "s1", *results("r", 10, t), turn_end("end", t + timedelta(minutes=5), outcome=pb.TURN_OUTCOME_FAILED)
    )
    cancelled = await env.append(
        "s2", *results("r", 10, t), turn_end("end", t + timedelta(minutes=5), outcome=pb.TURN_OUTCOME_CANCELLED)
    )
    assert list(failed.queued_checks) == list(cancelled.queued_checks) == []


async def test_a_turn_end_keeps_the_sessions_word_in_its_row_and_reads_back_as_the_common_outcome(env, clock, dsn):
    """The domain's outcome is libs.common.outcomes.TurnOutcome (issue 13); the column still holds
    the sessions contract's word ('succeeded', not 'done'), so rows written before read the same."""
    t = clock.now()
    words = {
        pb.TURN_OUTCOME_SUCCEEDED: "succeeded",
        pb.TURN_OUTCOME_FAILED: "failed",
        pb.TURN_OUTCOME_CANCELLED: "cancelled",
    }
    for n, outcome in enumerate(words):
        await env.append(f"o{n}", user("u", "go", t), turn_end("end", t + timedelta(seconds=5), outcome=outcome))
    conn = await asyncpg.connect(dsn)
    try:
        stored = await conn.fetch(
            "SELECT session_id, turn_outcome FROM session_events WHERE kind = 'turn_end' AND session_id LIKE 'o%'"
        )
    finally:
        await conn.close()
    assert {r["session_id"]: r["turn_outcome"] for r in stored} == {f"o{n}": w for n, w in enumerate(words.values())}
    store = env.sessions.worker.store
    read = {}
    for n in range(len(words)):
        events, _ = await store.latest("acme", f"o{n}", [EventKind.TURN_END], 10, 10)
        read[f"o{n}"] = events[0].turn_outcome
    assert read == {"o0": TurnOutcome.DONE, "o1": TurnOutcome.FAILED, "o2": TurnOutcome.CANCELLED}


async def test_work_a_check_covered_during_the_turn_is_excluded_and_later_work_triggers_again(env, clock):
    t = clock.now()
    await env.append("s1", user("u", "go", t), *results("a", 6, t))
    # A plan milestone during the turn covers the six results so far.
    plan = await env.plan("s1", 1, step("x", DONE))
    assert plan.HasField("queued_check")
    after = await env.append(
        "s1", *results("b", 2, t + timedelta(seconds=10)), turn_end("end1", t + timedelta(seconds=20))
    )
    assert list(after.queued_checks) == []  # only two results since the milestone
    # A later turn's end: only what no check covered counts, and six new results are substantial.
    more = await env.append(
        "s1",
        *results("c", 6, t + timedelta(seconds=30), turn="t2"),
        turn_end("end2", t + timedelta(seconds=40), turn="t2"),
    )
    assert len(more.queued_checks) == 1
    # The same turn end sent again is a duplicate event: nothing new.
    again = await env.append("s1", turn_end("end2", t + timedelta(seconds=40), turn="t2"))
    assert again.duplicate_count == 1 and list(again.queued_checks) == []


async def test_the_duration_counts_only_work_after_the_milestone(env, clock):
    t = clock.now()
    await env.append("s1", user("u", "go", t), result("r0", "bash", "ok", t))
    clock.advance(minutes=5)
    await env.plan("s1", 1, step("x", DONE))  # covers everything so far (5 minutes of it)
    end = await env.append(
        "s1", result("r1", "bash", "ok", t + timedelta(minutes=5, seconds=5)), turn_end("e", t + timedelta(minutes=6))
    )
    assert list(end.queued_checks) == []  # 55 seconds of work since the milestone
    later = await env.append(
        "s1",
        result("r2", "bash", "ok", t + timedelta(minutes=7), turn="t2"),
        turn_end("e2", t + timedelta(minutes=9, seconds=30), turn="t2"),
    )
    assert len(later.queued_checks) == 1  # a new turn: 2.5 minutes with a result


# ------------------------------------------------------------------------------------- manual


async def test_check_recent_work_reuses_a_queued_or_running_check(env, clock):
    await _start(env, clock)
    first = await env.manual("s1")
    assert not first.reused and first.check.trigger == pb.CHECK_TRIGGER_MANUAL
    again = await env.manual("s1")
    assert again.reused and again.check.check_id == first.check.check_id
    await env.sessions.worker.store.start_check(__import__("uuid").UUID(first.check.check_id), clock.now())
    running = await env.manual("s1")
    assert running.reused and running.check.state == pb.CHECK_STATE_RUNNING
    assert await env.drain() == 1
    clock.advance(minutes=1)
    fresh = await env.manual("s1")
    assert not fresh.reused and fresh.check.check_id != first.check.check_id


async def test_a_plan_check_in_the_queue_is_reused_by_the_manual_check(env, clock):
    await _start(env, clock)
    plan = await env.plan("s1", 1, step("a", DONE))
    manual = await env.manual("s1")
    assert manual.reused and manual.check.check_id == plan.queued_check.check_id


# ------------------------------------------------------------------------------------- sessions


async def test_appends_are_idempotent_per_event_id(env, clock):
    t = clock.now()
    first = await env.append("s1", user("u1", "hi", t), tool_request("q1", "bash", "ls", t))
    assert first.appended_count == 2 and first.duplicate_count == 0
    second = await env.append("s1", user("u1", "hi again", t), user("u2", "more", t), user("u2", "dup in batch", t))
    assert second.appended_count == 1 and second.duplicate_count == 2


async def test_a_stranger_cannot_tell_a_session_exists(env, clock):
    await _start(env, clock)
    errors = []
    for call in (
        lambda: env.append("s1", user("x", "hi", clock.now()), user="mallory"),
        lambda: env.plan("s1", 1, step("a", DONE), user="mallory"),
        lambda: env.manual("s1", user="mallory"),
        lambda: env.checks("s1", user="mallory"),
        lambda: env.checks("no-such-session"),
        lambda: env.manual("no-such-session"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call()
        errors.append(err.value)
    for e in errors:
        assert e.code() == grpc.StatusCode.NOT_FOUND and info(e).reason == "SESSION_NOT_FOUND"
    # The stranger's answer is word for word the answer for a session that does not exist.
    assert errors[3].details() == errors[4].details().replace("no-such-session", "s1")
    assert await env.checks("s1") == []  # and nothing was queued for them


async def test_the_first_append_fixes_owner_workspace_seat_and_role(env, clock):
    t = clock.now()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", user("u", "hi", t), seat="")
    assert info(err.value).reason == "FIELD_REQUIRED" and info(err.value).metadata["field"] == "seat"
    first = await env.append("s1", user("u", "hi", t))
    assert first.workspace == "default"  # sessions.default_workspace
    later = await env.append("s1", user("u2", "hi", t), seat="", role="", workspace="")
    assert later.appended_count == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", user("u3", "hi", t), workspace="elsewhere")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info(err.value).reason == "SESSION_WORKSPACE_MISMATCH"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", user("u4", "hi", t), seat="bob")
    assert info(err.value).reason == "SESSION_SEAT_MISMATCH"
    erin = await env.append("s2", user("u", "hi", t), user="erin")
    assert erin.workspace == "erin-space"  # the user's own default workspace
    named = await env.append("s3", user("u", "hi", t), workspace="payments")
    assert named.workspace == "payments"


async def test_events_are_validated(env, clock):
    t = clock.now()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", pb.SessionEvent(event_id="x", text="no kind"))
    assert info(err.value).metadata["field"] == "events[0].kind"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", pb.SessionEvent(event_id="x", kind=pb.EVENT_KIND_USER_MESSAGE, text="no time"))
    assert info(err.value).metadata["field"] == "events[0].event_time"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", turn_end("e", t, outcome=pb.TURN_OUTCOME_UNSPECIFIED))
    assert info(err.value).metadata["field"] == "events[0].turn_outcome"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", user("u", "x" * 100_001, t))
    assert info(err.value).reason == "FIELD_TOO_LONG"
