"""A run that self-iterates reports each round sent back for more work (self_iterate) and then its
settled turn under the same run id (the turn-start context is frozen per run id, and a round reuses
it). The settled report is the turn's reflection; a round's is filed apart (run id +
``#self_iterate``), so the settled one is never taken for a redelivery of the round. Real gRPC, real
Postgres, the offline model."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from tests.support.grpc_errors import error_info
from tests.support.turns import message, turn
from tests.test_reflector_harness import BOB_PREFERS, env_for  # noqa: F401  (the fixture)


async def test_the_settled_report_of_a_run_that_self_iterated_is_reflected(env_for, clock):  # noqa: F811
    async with env_for() as env:
        first = await env.submit(
            turn("run-1", now=clock.now(), messages=BOB_PREFERS, outcome=pb.TURN_OUTCOME_SELF_ITERATE)
        )
        assert first.queued and first.turn_id == "run-1"
        assert await env.harness.drain() == 1
        round_ = await env.reflection("run-1#self_iterate")
        assert round_.state == pb.REFLECTION_STATE_COMPLETED and round_.turn_id == "run-1#self_iterate"
        # Until the run settles, its run id answers with the round's reflection.
        assert (await env.reflection("run-1")).turn_id == "run-1#self_iterate"
        assert env.worker(round_, "persist_decider").gate == "unsettled"  # a round teaches no fact
        assert await env.notes() == []
        settled = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert settled.queued and settled.state == pb.REFLECTION_STATE_QUEUED
        assert await env.harness.drain() == 1
        record = await env.reflection("run-1")
        assert record.state == pb.REFLECTION_STATE_COMPLETED and record.turn_id == "run-1"
        assert env.worker(record, "persist_decider").status == pb.WORKER_STATUS_WROTE
        [note] = await env.notes()
        assert "weekly digests" in note.content
        # Reported again, the settled turn is a redelivery as before: reflected once.
        again = await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS))
        assert not again.queued and again.state == pb.REFLECTION_STATE_COMPLETED
        assert await env.harness.drain() == 0 and len(await env.notes()) == 1


async def test_every_round_of_a_run_is_one_reflection(env_for, clock):  # noqa: F811
    async with env_for() as env:
        rounds = [
            await env.submit(turn("run-1", now=clock.now(), messages=m, outcome=pb.TURN_OUTCOME_SELF_ITERATE))
            for m in (BOB_PREFERS, [message("bob", "Also: CC me on the release notes.")])
        ]
        assert [r.queued for r in rounds] == [True, False]
        assert await env.harness.drain() == 1
        listed = await env.stub.ListReflections(pb.ListReflectionsRequest(company="acme", seat="ana"))
        assert [r.turn_id for r in listed.reflections] == ["run-1#self_iterate"]


async def test_a_run_id_that_names_a_round_is_refused(env_for, clock):  # noqa: F811
    async with env_for() as env:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await env.submit(turn("run-1#self_iterate", now=clock.now(), messages=BOB_PREFERS))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        code, info, bad = error_info(exc.value)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_INVALID"
        assert bad.field_violations[0].field == "turn.turn_id"
        assert await env.app.infra.pool.fetchval("SELECT count(*) FROM background_jobs") == 0


async def test_the_runs_episode_ends_settled_after_its_rounds(env_for, clock):  # noqa: F811
    """End to end: the round's reflection records a self_iterate episode, the settled report's
    supersedes it — one row for the run, settled, as clustered synthesis and retention expect."""
    episodist = {"reflection": {"workers": ["episodist"]}}
    async with env_for(names=("diary", "episodes", "reflector"), learning=episodist) as env:
        tools = ["jira_search", "git_diff", "run_tests"]
        await env.submit(
            turn("run-1", now=clock.now(), messages=BOB_PREFERS, tools=tools, outcome=pb.TURN_OUTCOME_SELF_ITERATE)
        )
        assert await env.harness.drain() == 1
        rows = await env.app.infra.pool.fetch("SELECT outcome FROM episodes WHERE seat = 'ana'")
        assert [r["outcome"] for r in rows] == ["self_iterate"]
        await env.submit(turn("run-1", now=clock.now(), messages=BOB_PREFERS, tools=[*tools, "open_pr"]))
        assert await env.harness.drain() == 1
        rows = await env.app.infra.pool.fetch("SELECT outcome, tools_called FROM episodes WHERE seat = 'ana'")
        assert [(r["outcome"], list(r["tools_called"])) for r in rows] == [("done", [*tools, "open_pr"])]
