"""Promotion drafts' provenance (issue 17): a draft the cross-agent promotion files records the
runs (seat and run id) it was distilled from, the model and the prompt version, read back by
KnowledgeService.GetDraftProvenance; an erasure of a person finds through that record a draft
resting on one of their turns even when its text names no one; the refusals.

Real parts: the episodes, skills and knowledge services on a loopback gRPC server, Postgres, the
promotion pass with the offline distillation rule.
"""

from __future__ import annotations

import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.common.v1 import provenance_pb2
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kpb
from services.knowledge.promotion import PROMPT_VERSION
from tests.support.app import open_app
from tests.support.erasure_checks import subject_target
from tests.support.grpc_errors import error_info
from tests.test_promotion import NAMES, Env, converge, settings

pytestmark = pytest.mark.timeout(300)


async def _promoted(env: Env) -> str:
    await converge(env)
    report = await env.promote()
    assert report.promoted == 1 and not report.failures
    [event] = await env.events("skill_promoted")
    return str(event["payload"]["page_id"])


async def test_a_draft_names_the_runs_and_seats_it_was_promoted_from(env):
    page_id = await _promoted(env)
    resp = await env.knowledge.GetDraftProvenance(kpb.GetDraftProvenanceRequest(company="acme", page_id=page_id))
    # converge(): each of three seats ran twice, runs numbered in order.
    expected = {("ana", "run-1"), ("ana", "run-2"), ("bo", "run-3"), ("bo", "run-4"), ("cy", "run-5"), ("cy", "run-6")}
    assert {(s.seat, s.turn_id) for s in resp.sources} == expected
    assert list(resp.seats) == ["ana", "bo", "cy"]
    assert (resp.unit, resp.container_key) == ("platform", "plat") and resp.title.startswith("Team routine:")
    prov = resp.provenance
    assert sorted(prov.turn_ids) == sorted(t for _, t in expected)
    assert prov.model == "offline-rules" and prov.prompt_version == PROMPT_VERSION and len(PROMPT_VERSION) == 16
    assert prov.writer == "skill_promotion" and resp.record_time.seconds > 0
    # The people whose messages the runs answered (the episodes' subjects).
    assert sorted(s.handle for s in prov.subjects) == ["lead-of-ana", "lead-of-bo", "lead-of-cy"]


async def test_erasing_a_person_whose_turn_a_draft_rests_on_removes_the_draft(env):
    page_id = await _promoted(env)

    def target(erasure_id: str) -> er.ErasureTarget:
        # Someone who sent the message of run-3; the draft's text names no one.
        return subject_target("zed", erasure_id, turn_ids=["run-3"])

    found = await env.knowledge.FindRows(kpb.FindRowsRequest(target=target("00000000-0000-0000-0000-00000000000a")))
    tables = {t.table: t for t in found.report.tables}
    assert list(tables["draft_provenance"].ids) == [page_id] and list(tables["knowledge_pages"].ids) == [page_id]
    erased = await env.knowledge.EraseRows(kpb.EraseRowsRequest(target=target("00000000-0000-0000-0000-00000000000b")))
    assert {t.table: t.count for t in erased.report.tables} == {"knowledge_pages": 1, "draft_provenance": 1}
    after = await env.knowledge.FindRows(kpb.FindRowsRequest(target=target("00000000-0000-0000-0000-00000000000c")))
    assert list(after.report.tables) == []
    assert await env.app.infra.pool.fetchval("SELECT count(*) FROM knowledge_pages WHERE id = $1::uuid", page_id) == 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.knowledge.GetDraftProvenance(kpb.GetDraftProvenanceRequest(company="acme", page_id=page_id))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_get_draft_provenance_refusals(env):
    page_id = await _promoted(env)

    async def refused(company: str, pid: str) -> tuple:  # type: ignore[type-arg]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.knowledge.GetDraftProvenance(kpb.GetDraftProvenanceRequest(company=company, page_id=pid))
        return error_info(err.value)

    for bad_id in ("not a page", ""):
        code, _, bad = await refused("acme", bad_id)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and [v.field for v in bad.field_violations] == ["page_id"]
    code, info, _ = await refused("acme", "7d0d9a8e-1111-4222-8333-444455556666")
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "DRAFT_NOT_FOUND"
    # Another company's draft is not found (never told it exists).
    code, info, _ = await refused("globex", page_id)
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "DRAFT_NOT_FOUND"


@pytest.fixture
async def env(make_settings, dsn, clock):
    async with open_app(settings(make_settings), dsn, names=NAMES, clock=clock) as app:
        yield Env(app, clock)


async def test_a_draft_written_over_the_rpc_records_the_sources_it_names(env):
    request = kpb.WritePromotionDraftRequest(
        company="acme",
        unit="platform",
        container_key="plat",
        title="Team routine: by hand (0001)",
        body="1. Do it.\n",
        sources=[kpb.DraftSource(seat="bo", turn_id="r-9"), kpb.DraftSource(seat="ana", turn_id="r-7")],
        provenance=provenance_pb2.Provenance(model="m-1", prompt_version="p-1"),
    )
    written = await env.knowledge.WritePromotionDraft(request)
    resp = await env.knowledge.GetDraftProvenance(
        kpb.GetDraftProvenanceRequest(company="acme", page_id=written.page_id)
    )
    assert [(s.seat, s.turn_id) for s in resp.sources] == [("bo", "r-9"), ("ana", "r-7")]
    assert list(resp.seats) == ["ana", "bo"] and list(resp.provenance.turn_ids) == ["r-9", "r-7"]
    assert (resp.provenance.model, resp.provenance.prompt_version) == ("m-1", "p-1")
    assert resp.provenance.writer == "write_promotion_draft"
    # A source without a seat is refused, naming the field; nothing is written.
    del request.sources[:]
    request.sources.append(kpb.DraftSource(seat="", turn_id="r-1"))
    request.title = "Team routine: refused (0002)"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.knowledge.WritePromotionDraft(request)
    code, _, bad = error_info(err.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and [v.field for v in bad.field_violations] == ["sources[0].seat"]
    assert await env.app.infra.pool.fetchval("SELECT count(*) FROM draft_provenance") == 1
