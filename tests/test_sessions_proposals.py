"""Skill proposals (spec "Writes and isolation": new skills always remain proposals for review):
the same exact and semantic duplicate checks as every skill path, rejection suppression, approval
through CreateSkill's path and never a live skill without it; the distill_skill builtin proposing
through the same path; and a session check's candidate suppressed after a person rejected it."""

from __future__ import annotations

import json

import grpc
import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pgrpc
from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as spb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sgrpc
from tests.support.sessions import info, is_review, open_sessions, result, scripted_llm, verification
from tests.support.skills import create_skill

CANDIDATE = {
    "name": "fix-payments-schema-test",
    "summary": "Fix a payments test that fails on a missing database schema",
    "body": "1. Run make migrate.\n2. Commit the fix.\n3. Run pytest.",
    "tool_sequence": ["make", "git", "pytest"],
}
CHECKS = [spb.DUPLICATE_CHECK_EXACT_NAME, spb.DUPLICATE_CHECK_EXACT_BODY, spb.DUPLICATE_CHECK_TOOL_SET]


def _propose(stub, request_id: str = "", seat: str = "ana", **fields):  # type: ignore[no-untyped-def]
    return stub.ProposeSkill(
        spb.ProposeSkillRequest(
            company="acme",
            seat=seat,
            origin=spb.PROPOSAL_ORIGIN_SESSION_CHECK,
            source=spb.ProposalSource(session_id="s1", check_id="c1", evidence_ids=["r1"]),
            request_id=request_id,
            **{**CANDIDATE, **fields},
        )
    )


@pytest.fixture
async def skills(make_settings, dsn, edge_index, clock, local_embedder):
    settings = make_settings(
        companies={"acme": {"roles": {"swe": {}, "bot": {"tool_permissions": {"distill_skill": "deny"}}}}}
    )
    async with open_sessions(settings, dsn, clock=clock, embedder=local_embedder, index=edge_index) as env:
        yield env, sgrpc.SkillServiceStub(env.app.channel)


async def test_a_proposal_waits_for_a_person_and_is_never_live_by_itself(skills):
    _, stub = skills
    made = await _propose(stub, request_id="r-1")
    assert made.disposition == spb.PROPOSAL_DISPOSITION_CREATED
    assert list(made.checks_run) == [*CHECKS, spb.DUPLICATE_CHECK_EMBEDDING]
    assert made.proposal.state == spb.PROPOSAL_STATE_PENDING and made.proposal.source.evidence_ids == ["r1"]
    live = await stub.ListSkills(spb.ListSkillsRequest(company="acme", seat="ana"))
    assert list(live.skills) == []
    again = await _propose(stub, request_id="r-1")  # a retry with the same key files nothing
    assert again.disposition == spb.PROPOSAL_DISPOSITION_ALREADY_PROPOSED and again.proposal.id == made.proposal.id
    listed = await stub.ListSkillProposals(
        spb.ListSkillProposalsRequest(company="acme", seat="ana", state=spb.PROPOSAL_STATE_PENDING)
    )
    assert [p.id for p in listed.proposals] == [made.proposal.id]


async def test_approval_makes_the_live_skill_through_the_create_path(skills):
    _, stub = skills
    made = (await _propose(stub)).proposal
    approved = await stub.ApproveSkillProposal(
        spb.ApproveSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id, reviewer="lead", reason="ok")
    )
    assert approved.proposal.state == spb.PROPOSAL_STATE_APPROVED and approved.proposal.skill_id == approved.skill.id
    assert approved.skill.name == CANDIDATE["name"] and approved.skill.body == CANDIDATE["body"]
    assert approved.skill.trigger == spb.SKILL_TRIGGER_SINGLE and list(approved.skill.source_turn_ids) == ["session:s1"]
    assert approved.proposal.decided_by == "lead"
    again = await stub.ApproveSkillProposal(
        spb.ApproveSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id)
    )
    assert again.skill.id == approved.skill.id  # approving twice makes one skill
    live = await stub.ListSkills(spb.ListSkillsRequest(company="acme", seat="ana"))
    assert [s.id for s in live.skills] == [approved.skill.id]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RejectSkillProposal(spb.RejectSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and info(err.value).reason == "PROPOSAL_APPROVED"
    # Now a live skill: the same candidate again is its duplicate.
    dup = await _propose(stub)
    assert dup.disposition == spb.PROPOSAL_DISPOSITION_DUPLICATE_SKILL
    assert dup.match.check == spb.DUPLICATE_CHECK_EXACT_NAME and dup.match.skill_id == approved.skill.id


async def test_an_approval_the_create_gates_refuse_leaves_the_proposal_pending(skills):
    _, stub = skills
    made = (await _propose(stub)).proposal
    # Meanwhile a skill with the same tool set is drafted another way.
    await create_skill(
        stub, "other", ["pytest", "git", "make"], summary="something else", body="# other", source_turn_ids=["t9"]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ApproveSkillProposal(
            spb.ApproveSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id)
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and info(err.value).reason == "SKILL_DUPLICATE_TOOL_SET"
    listed = await stub.ListSkillProposals(spb.ListSkillProposalsRequest(company="acme", seat="ana"))
    assert listed.proposals[0].state == spb.PROPOSAL_STATE_PENDING


async def test_a_name_an_archived_skill_holds_is_refused_at_proposal_and_said_at_approval(skills):
    """A name stays the seat's after archiving, so CreateSkill (approval's path) refuses it for ever:
    a candidate under it is refused naming the field, not filed as a proposal no one can approve."""
    env, stub = skills
    archived = await create_skill(stub, CANDIDATE["name"], ["jira_search"], summary="old", body="# old")
    await stub.ArchiveSkill(spb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=archived.id))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _propose(stub, request_id="r-archived")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and info(err.value).reason == "SKILL_NAME_TAKEN"
    meta = info(err.value).metadata
    assert (meta["field"], meta["state"], meta["skill_id"]) == ("name", "archived", archived.id)
    assert await env.app.infra.pool.fetchval("SELECT count(*) FROM skill_proposals") == 0
    # Renamed, it is filed. A skill taking its name afterwards (then archived) refuses the approval,
    # saying which skill and in what state; the proposal stays pending for a person to reject.
    made = (await _propose(stub, name="fix-payments-schema")).proposal
    later = await create_skill(stub, "fix-payments-schema", ["psql"], summary="other", body="# other")
    await stub.ArchiveSkill(spb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=later.id))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ApproveSkillProposal(
            spb.ApproveSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id)
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and info(err.value).reason == "SKILL_NAME_TAKEN"
    assert (info(err.value).metadata["state"], info(err.value).metadata["skill_id"]) == ("archived", later.id)
    listed = await stub.ListSkillProposals(spb.ListSkillProposalsRequest(company="acme", seat="ana"))
    assert [(p.id, p.state) for p in listed.proposals] == [(made.id, spb.PROPOSAL_STATE_PENDING)]


async def test_the_exact_and_semantic_checks_against_skills_and_pending_proposals(skills):
    _, stub = skills
    first = (await _propose(stub)).proposal
    same_name = await _propose(stub, name="Fix-Payments-Schema-Test ", body="different", tool_sequence=["a"])
    assert same_name.disposition == spb.PROPOSAL_DISPOSITION_DUPLICATE_PROPOSAL
    assert same_name.match.check == spb.DUPLICATE_CHECK_EXACT_NAME and same_name.proposal.id == first.id
    same_body = await _propose(
        stub,
        name="another",
        summary="x",
        body="1. run make migrate.\n2.  commit the fix.\n3. run pytest.",
        tool_sequence=["b"],
    )
    assert same_body.match.check == spb.DUPLICATE_CHECK_EXACT_BODY
    same_tools = await _propose(
        stub, name="third", summary="y", body="z", tool_sequence=["pytest", "make", "git", "git"]
    )
    assert same_tools.match.check == spb.DUPLICATE_CHECK_TOOL_SET and same_tools.match.similarity == 1.0
    paraphrase = await _propose(
        stub,
        name="repair-payment-schema-tests",
        summary="Repair payment tests failing because the database schema is missing",
        body="Different words entirely.",
        tool_sequence=["psql"],
    )
    assert paraphrase.disposition == spb.PROPOSAL_DISPOSITION_DUPLICATE_PROPOSAL
    assert paraphrase.match.check == spb.DUPLICATE_CHECK_EMBEDDING and paraphrase.match.similarity >= 0.85
    unrelated = await _propose(
        stub,
        name="deploy-frontend",
        summary="Deploy the web frontend to staging",
        body="1. build",
        tool_sequence=["npm"],
    )
    assert unrelated.disposition == spb.PROPOSAL_DISPOSITION_CREATED


async def test_a_rejected_candidate_is_not_proposed_again(skills):
    _, stub = skills
    made = (await _propose(stub)).proposal
    rejected = await stub.RejectSkillProposal(
        spb.RejectSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id, reviewer="lead", reason="no")
    )
    assert rejected.proposal.state == spb.PROPOSAL_STATE_REJECTED and rejected.proposal.decision_reason == "no"
    for fields in (
        {},
        {
            "name": "repair-payment-schema-tests",
            "summary": "Repair payment tests failing because the database schema is missing",
            "body": "other",
            "tool_sequence": ["psql"],
        },
    ):
        again = await _propose(stub, **fields)
        assert again.disposition == spb.PROPOSAL_DISPOSITION_SUPPRESSED and again.proposal.id == made.id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ApproveSkillProposal(
            spb.ApproveSkillProposalRequest(company="acme", seat="ana", proposal_id=made.id)
        )
    assert info(err.value).reason == "PROPOSAL_REJECTED"
    # Another seat's rejection suppresses nothing here.
    other = await _propose(stub, seat="bo")
    assert other.disposition == spb.PROPOSAL_DISPOSITION_CREATED


async def test_without_an_embedder_the_response_says_the_embedding_check_did_not_run(
    make_settings, dsn, edge_index, clock
):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        made = await _propose(sgrpc.SkillServiceStub(env.app.channel))
    assert made.disposition == spb.PROPOSAL_DISPOSITION_CREATED and list(made.checks_run) == CHECKS


async def test_proposals_are_validated_like_skills(skills):
    _, stub = skills
    for fields, field in (
        ({"name": "two\nlines"}, "name"),
        ({"tool_sequence": []}, "tool_sequence"),
        ({"body": "x" * 20_001}, "body"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _propose(stub, **fields)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info(err.value).metadata["field"] == field
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ProposeSkill(spb.ProposeSkillRequest(company="acme", seat="ana", **CANDIDATE))
    assert info(err.value).metadata["field"] == "origin"


async def test_distill_skill_proposes_through_the_same_path(skills):
    env, stub = skills
    builtins = pgrpc.BuiltinServiceStub(env.app.channel)
    tools = pgrpc.PrefetchServiceStub(env.app.channel)
    call = ppb.DistillSkillRequest(
        company="acme", seat="ana", role="swe", turn_id="turn-7", session_id="s9", **CANDIDATE
    )
    first = await builtins.DistillSkill(call)
    assert first.disposition == "created" and "a person reviews it" in first.text
    again = await builtins.DistillSkill(call)
    assert again.disposition == "already_proposed" and again.proposal_id == first.proposal_id
    listed = await stub.ListSkillProposals(spb.ListSkillProposalsRequest(company="acme", seat="ana"))
    (p,) = listed.proposals
    assert (
        p.origin == spb.PROPOSAL_ORIGIN_DISTILL_SKILL and p.source.turn_id == "turn-7" and p.source.session_id == "s9"
    )
    await stub.RejectSkillProposal(spb.RejectSkillProposalRequest(company="acme", seat="ana", proposal_id=p.id))
    later = await builtins.DistillSkill(
        ppb.DistillSkillRequest(company="acme", seat="ana", role="swe", turn_id="turn-8", **CANDIDATE)
    )
    assert later.disposition == "suppressed" and "rejected" in later.text
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await builtins.DistillSkill(ppb.DistillSkillRequest(company="acme", seat="ana", role="bot", **CANDIDATE))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and info(err.value).reason == "TOOL_DENIED"
    offered = await tools.ListTools(ppb.ListToolsRequest(company="acme", role="bot"))
    assert "distill_skill" not in [t.name for t in offered.tools]
    offered = await tools.ListTools(ppb.ListToolsRequest(company="acme", role="swe"))
    assert "distill_skill" in [t.name for t in offered.tools]


def _review_proposing_the_candidate(body: dict) -> str:
    """The scripted learning review: proposes CANDIDATE resting on every event it was shown."""
    if not is_review(body):
        return '{"verdicts": []}'
    lines = body["messages"][-1]["content"].splitlines()
    refs = [ln[1 : ln.index("]")] for ln in lines if ln.startswith("[E")]
    return json.dumps(
        {"skill_candidate": {**{k: v for k, v in CANDIDATE.items() if k != "tool_sequence"}, "evidence": refs}}
    )


async def _append_a_verified_run(env, session: str, t) -> None:  # type: ignore[no-untyped-def]
    """Two results and a passing verification in ``session``: what the review proposes from."""
    await env.append(
        session,
        result(f"{session}-a", "make", "migrated", t),
        result(f"{session}-b", "git", "committed", t),
        verification(f"{session}-v", "pytest", "passed", t),
    )


async def _check_now(env, session: str):  # type: ignore[no-untyped-def]
    """A manual learning check of ``session``, drained; the one check it made."""
    await env.manual(session)
    await env.drain()
    (check,) = await env.checks(session)
    return check


async def test_a_session_checks_candidate_is_suppressed_once_a_person_rejected_it(
    make_settings, dsn, edge_index, clock, scripted_openai
):
    scripted_openai.chat_handler = _review_proposing_the_candidate
    settings = make_settings(providers=scripted_llm(scripted_openai))
    async with open_sessions(settings, dsn, clock=clock, embedder=None, index=edge_index) as env:
        stub = sgrpc.SkillServiceStub(env.app.channel)
        t = clock.now()
        for session in ("s1", "s2"):
            await _append_a_verified_run(env, session, t)
        first = await _check_now(env, "s1")
        (out,) = first.outputs
        await stub.RejectSkillProposal(spb.RejectSkillProposalRequest(company="acme", seat="ana", proposal_id=out.id))
        second = await _check_now(env, "s2")
        live = await stub.ListSkills(spb.ListSkillsRequest(company="acme", seat="ana"))
    assert out.kind == pb.OUTPUT_KIND_SKILL_PROPOSAL and first.counts.proposals_created == 1
    (dropped,) = second.dropped
    assert dropped.kind == pb.OUTPUT_KIND_SKILL_PROPOSAL and "rejected proposal" in dropped.reason
    assert "not proposed again" in dropped.reason and second.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY
    assert list(live.skills) == []


async def test_a_session_checks_proposal_records_what_proposed_it_and_the_approval_carries_it(
    make_settings, dsn, edge_index, clock, scripted_openai
):
    """Issue 17: a proposal from a learning check records the session owner it rests on, the
    review's model and prompt version; approving it gives the live skill that provenance."""

    scripted_openai.chat_handler = _review_proposing_the_candidate
    settings = make_settings(providers=scripted_llm(scripted_openai))
    async with open_sessions(settings, dsn, clock=clock, embedder=None, index=edge_index) as env:
        stub = sgrpc.SkillServiceStub(env.app.channel)
        t = clock.now()
        await _append_a_verified_run(env, "s1", t)
        check = await _check_now(env, "s1")
        (out,) = check.outputs
        listed = await stub.ListSkillProposals(spb.ListSkillProposalsRequest(company="acme", seat="ana"))
        (proposal,) = listed.proposals
        approved = await stub.ApproveSkillProposal(
            spb.ApproveSkillProposalRequest(company="acme", seat="ana", proposal_id=out.id, reviewer="lead")
        )
        prov = (
            await stub.GetSkillProvenance(
                spb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=approved.skill.id)
            )
        ).provenance
    recorded = proposal.provenance
    assert proposal.id == out.id
    assert recorded.model and recorded.model == prov.model  # what the scripted endpoint answered as
    assert recorded.prompt_version and recorded.prompt_version == prov.prompt_version
    assert [s.handle for s in recorded.subjects] == [check.user] == [s.handle for s in prov.subjects]
    assert recorded.session_id == prov.session_id == "s1" and prov.check_id == check.check_id
    assert set(prov.event_ids) == set(out.evidence_ids) and prov.writer.startswith("skill_proposal:")


async def test_a_session_checks_proposal_filed_without_the_semantic_check_says_so(
    make_settings, dsn, edge_index, clock, scripted_openai, local_embedder
):
    """No embedder answered: the skills service files the proposal on the exact checks alone
    (DUPLICATE_CHECK_EMBEDDING not among checks_run), and the receipt names it NOT_DEDUPLICATED
    rather than a clean written; with the embedder up it is clean."""
    scripted_openai.chat_handler = _review_proposing_the_candidate
    settings = make_settings(providers=scripted_llm(scripted_openai))
    async with open_sessions(settings, dsn, clock=clock, embedder=None, index=edge_index) as env:
        await _append_a_verified_run(env, "s1", clock.now())
        unchecked = await _check_now(env, "s1")
    async with open_sessions(settings, dsn, clock=clock, embedder=local_embedder, index=edge_index) as env:
        await _append_a_verified_run(env, "s2", clock.now())
        # A name of its own, so the exact checks do not meet the first proposal.
        CANDIDATE_NAME = "fix-payments-schema-test-again"
        scripted_openai.chat_handler = lambda body: _review_proposing_the_candidate(body).replace(
            CANDIDATE["name"], CANDIDATE_NAME
        )
        checked = await _check_now(env, "s2")
    (out,) = unchecked.outputs
    assert out.kind == pb.OUTPUT_KIND_SKILL_PROPOSAL and out.disposition == pb.OUTPUT_DISPOSITION_WRITTEN
    (pf,) = unchecked.partial_failures
    assert (pf.kind, pf.failure, pf.output_id) == (
        pb.OUTPUT_KIND_SKILL_PROPOSAL,
        pb.FAILURE_KIND_NOT_DEDUPLICATED,
        out.id,
    )
    assert CANDIDATE["name"] in pf.detail and "semantic duplicate check" in pf.detail
    assert unchecked.outcome == pb.CHECK_OUTCOME_COMPLETED
    assert len(checked.outputs) == 1 and list(checked.partial_failures) == [], checked.partial_failures
