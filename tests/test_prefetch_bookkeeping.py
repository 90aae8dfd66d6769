"""A turn start's bookkeeping off its read path, every rule kept: the auxiliary calls' charges and
auxiliary_spend events, the prefetch_summary and the knowledge service's knowledge_read are written
in ONE transaction with the frozen context (one commit), the note uses and the offered stamps beside
it — and all of it is in the database when the answer arrives, with each row's own time and trace.
A call whose build fails still has its auxiliary calls charged and reported. Old frozen contexts
are still pruned (by the service's clock, beside the turns). Real services, real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from tests.test_prefetch_support import block, default_settings, open_env

ASK = "Can you send Bob the weekly billing export digest?"


async def test_the_bookkeeping_is_one_transaction_with_the_frozen_context_and_in_place_on_answer(
    make_settings, dsn, clock, local_embedder, edge_index
):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as env:
        # The all-in-one: the knowledge service, called in-process, adds its knowledge_read to the
        # turn's batch (over the wire it writes its own, in its own transaction).
        env.app.infra.channels.in_process = True
        note = await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
        await env.turn("Message from Bob: Slack message", "Send me the billing export digest", "Sent it.")
        skill = await env.skill("billing-digest", "Export billing and post the weekly digest to the requester")
        await env.page("eng", "Billing export runbook", "How to run the weekly billing export and send the digest.")
        pool = env.app.infra.pool
        spends_before = await pool.fetchval("SELECT count(*) FROM events WHERE kind = 'auxiliary_spend'")

        resp = await env.build(ASK, turn_id="run-1")

        # In place when the answer arrives: no waiting.
        assert list(block(resp, pb.BLOCK_PERSONAL_MEMORY).ids) == [note]
        assert await env.uses(note) == 1  # a use is a selection
        [s] = (await env.skills.ListSkills(skill_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        assert s.id == skill.id and s.last_offered_time.ToDatetime(tzinfo=UTC) == clock.now()  # offered = used
        frozen_tx = await pool.fetchval(
            "SELECT xmin::text FROM turn_contexts WHERE turn_id = 'run-1' AND state = 'built'"
        )
        assert frozen_tx is not None
        rows = await pool.fetch(
            "SELECT kind, xmin::text AS tx, trace_id FROM events WHERE turn_id = 'run-1' OR kind = 'knowledge_read'"
        )
        kinds = sorted(r["kind"] for r in rows)
        spends = [r for r in rows if r["kind"] == "auxiliary_spend"]
        # memory filter, knowledge query and episode briefing: each charged and reported
        assert len(spends) == 3 and spends_before + 3 == await pool.fetchval(
            "SELECT count(*) FROM events WHERE kind = 'auxiliary_spend'"
        )
        assert "prefetch_summary" in kinds and "knowledge_read" in kinds
        # one transaction: the frozen context, every event of the turn and the token charges
        assert {r["tx"] for r in rows} == {frozen_tx}, rows
        charged = await pool.fetch(
            "SELECT seat, xmin::text AS tx FROM token_spend WHERE company = 'acme' ORDER BY seat"
        )
        assert [c["seat"] for c in charged] == ["", "ana"] and {c["tx"] for c in charged} == {frozen_tx}

        # A second call of the run is answered from the frozen context: nothing counted twice.
        again = await env.build(ASK, turn_id="run-1")
        assert again.markdown == resp.markdown
        assert await env.uses(note) == 1
        assert await pool.fetchval("SELECT count(*) FROM events WHERE kind = 'auxiliary_spend'") == spends_before + 3


async def test_old_frozen_contexts_are_still_pruned(make_settings, dsn, clock, local_embedder, edge_index):
    settings = default_settings(make_settings, learning={"prefetch": {"frozen_context_hours": 1}})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        pool = env.app.infra.pool
        await env.build(ASK, turn_id="old-run")
        clock.advance(hours=2)
        await env.build(ASK, turn_id="new-run")
        async with asyncio.timeout(20):  # pruned beside the turn, not in its way
            while await pool.fetchval("SELECT count(*) FROM turn_contexts WHERE turn_id = 'old-run'"):
                await asyncio.sleep(0.05)
        assert await pool.fetchval("SELECT count(*) FROM turn_contexts WHERE turn_id = 'new-run'") == 1
