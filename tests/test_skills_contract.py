"""The skills' request rules that moved from the use cases into the contract (issue 13): each
violating request, sent over real gRPC to a real server on a real Postgres, is INVALID_ARGUMENT with
the reason and the field the contract names, and writes nothing. The rules the use cases keep
(state, config, rules across fields) are tested with the RPCs that own them
(test_skills_catalogue.py, test_skills_refinement.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

SEAT = {"company": "acme", "seat": "ana"}
TEXT: dict[str, Any] = {
    **SEAT,
    "name": "open-pr",
    "summary": "s",
    "body": "b\n",
    "tool_sequence": ["jira_get_issue", "github_create_pr"],
}
"""What a skill and a proposal are both drafted from (CreateSkill's and ProposeSkill's shared fields)."""
DRAFT: dict[str, Any] = {**TEXT, "trigger": pb.SKILL_TRIGGER_SINGLE, "source_turn_ids": ["run-1"]}
ONE_ID = "00000000-0000-0000-0000-000000000001"

# Every request that names one skill takes exactly one of skill_id and skill_name.
NAMES_ONE_SKILL = [
    ("GetSkill", pb.GetSkillRequest, {}),
    ("UseSkill", pb.UseSkillRequest, {}),
    ("RefineSkill", pb.RefineSkillRequest, {"body": "B\n"}),
    ("AppendSkillObservation", pb.AppendSkillObservationRequest,
     {"kind": pb.OBSERVATION_KIND_OBSERVED, "observation": "o"}),
    ("ListSkillVersions", pb.ListSkillVersionsRequest, {}),
    ("RollbackSkill", pb.RollbackSkillRequest, {"version": 1}),
    ("PinSkill", pb.PinSkillRequest, {}),
    ("UnpinSkill", pb.UnpinSkillRequest, {}),
    ("ArchiveSkill", pb.ArchiveSkillRequest, {}),
    ("RestoreSkill", pb.RestoreSkillRequest, {}),
]  # fmt: skip


@pytest.fixture
async def skills(make_settings, dsn, clock):  # type: ignore[no-untyped-def]
    async with open_app(make_settings(), dsn, names=["skills"], clock=clock) as app:
        yield app, pb_grpc.SkillServiceStub(app.channel)


async def invalid(call) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A call refused as every call in this file is: INVALID_ARGUMENT from the skills service. The
    reason and the field it names."""
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "skills.agentlearn.dev"
    return info.reason, bad.field_violations[0].field


@pytest.mark.parametrize(("rpc", "request_type", "rest"), NAMES_ONE_SKILL)
@pytest.mark.parametrize("naming", [{}, {"skill_id": ONE_ID, "skill_name": "open-pr"}], ids=["neither", "both"])
async def test_a_request_naming_one_skill_takes_exactly_one_of_id_and_name(skills, rpc, request_type, rest, naming):
    app, stub = skills
    await stub.CreateSkill(pb.CreateSkillRequest(**DRAFT))
    refusal = await invalid(getattr(stub, rpc)(request_type(**SEAT, **rest, **naming)))
    assert refusal == ("ONE_OF_REQUIRED", "skill_id")
    # Nothing moved: the skill is as created (no use, no version, no state change).
    row = await app.infra.pool.fetchrow("SELECT version, use_count, state, pinned FROM synthesized_skills")
    assert tuple(row) == (1, 0, "active", False)


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"tool_sequence": [f"t{i}" for i in range(501)]}, "tool_sequence", "FIELD_TOO_LONG"),
        ({"tool_sequence": ["a", "x" * 201]}, "tool_sequence[1]", "FIELD_TOO_LONG"),
        ({"source_turn_ids": [f"r{i}" for i in range(501)], "trigger": pb.SKILL_TRIGGER_CLUSTERED,
          "cluster_size": 501}, "source_turn_ids", "FIELD_TOO_LONG"),
        ({"source_turn_ids": [""]}, "source_turn_ids[0]", "FIELD_REQUIRED"),
        ({"source_turn_ids": ["r" * 201]}, "source_turn_ids[0]", "FIELD_TOO_LONG"),
        ({"summary": ""}, "summary", "FIELD_REQUIRED"),
        ({"company": ""}, "company", "FIELD_REQUIRED"),
        ({"seat": "s" * 201}, "seat", "FIELD_TOO_LONG"),
        ({"cluster_size": -1}, "cluster_size", "FIELD_INVALID"),
    ],
)  # fmt: skip
async def test_create_limits_are_the_contracts(skills, overrides, field, reason):
    app, stub = skills
    assert await invalid(stub.CreateSkill(pb.CreateSkillRequest(**{**DRAFT, **overrides}))) == (reason, field)
    assert await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skills") == 0


@pytest.mark.parametrize(
    ("tools", "field", "reason"),
    [
        ([], "tool_set", "FIELD_REQUIRED"),
        (["a", ""], "tool_set[1]", "FIELD_REQUIRED"),
        (["x" * 201], "tool_set[0]", "FIELD_TOO_LONG"),
        ([f"t{i}" for i in range(501)], "tool_set", "FIELD_TOO_LONG"),
    ],
)
async def test_the_candidate_check_limits_are_the_contracts(skills, tools, field, reason):
    _, stub = skills
    refusal = await invalid(stub.CheckSkillCandidate(pb.CheckSkillCandidateRequest(**SEAT, tool_set=tools)))
    assert refusal == (reason, field)


async def test_marking_uses_checks_ids_in_the_contract(skills):
    app, stub = skills
    skill = (await stub.CreateSkill(pb.CreateSkillRequest(**DRAFT))).skill
    for ids, request_id, reason, field in (
        ([skill.id, "nope"], "k", "FIELD_INVALID", "skill_ids[1]"),
        ([ONE_ID] * 501, "k", "TOO_MANY_IDS", "skill_ids"),
        ([skill.id], "k" * 401, "FIELD_TOO_LONG", "request_id"),
    ):
        request = pb.MarkSkillsUsedRequest(**SEAT, skill_ids=ids, request_id=request_id)
        assert await invalid(stub.MarkSkillsUsed(request)) == (reason, field)
    # None of the refused calls counted a use.
    assert await app.infra.pool.fetchval("SELECT use_count FROM synthesized_skills") == 0


async def test_offers_over_the_limit_on_both_lists_together_are_refused_by_the_use_case(skills):
    """The one offer rule across two fields stays in the use case: each list is within its own
    limit, together they are not."""
    _, stub = skills
    request = pb.MarkSkillsOfferedRequest(**SEAT, skill_ids=[ONE_ID] * 300, skill_names=[f"s{i}" for i in range(300)])
    assert await invalid(stub.MarkSkillsOffered(request)) == ("TOO_MANY_IDS", "skill_ids")


@pytest.mark.parametrize(
    ("call", "field", "reason"),
    [
        (lambda s: s.ListSkills(pb.ListSkillsRequest(**SEAT, page_size=-1)), "page_size", "PAGE_SIZE_INVALID"),
        (lambda s: s.ListSkills(pb.ListSkillsRequest(**SEAT, view=9)), "view", "FIELD_INVALID"),
        (lambda s: s.ListSkillVersions(pb.ListSkillVersionsRequest(**SEAT, skill_name="open-pr", page_size=-1)),
         "page_size", "PAGE_SIZE_INVALID"),
        (lambda s: s.GetLearningHealth(pb.GetLearningHealthRequest(company="acme", seat="bad handle!")),
         "seat", "FIELD_INVALID"),
        (lambda s: s.UseSkill(pb.UseSkillRequest(**SEAT, skill_id="not-a-uuid")), "skill_id", "FIELD_INVALID"),
        (lambda s: s.RefineSkill(pb.RefineSkillRequest(**SEAT, skill_name="open-pr", body="")), "body",
         "FIELD_REQUIRED"),
        (lambda s: s.AppendSkillObservation(pb.AppendSkillObservationRequest(
            **SEAT, skill_name="open-pr", kind=pb.OBSERVATION_KIND_OBSERVED, observation="")),
         "observation", "FIELD_REQUIRED"),
    ],
)  # fmt: skip
async def test_other_limits_are_the_contracts(skills, call, field, reason):
    _, stub = skills
    await stub.CreateSkill(pb.CreateSkillRequest(**DRAFT))
    assert await invalid(call(stub)) == (reason, field)


PROPOSAL: dict[str, Any] = {**TEXT, "origin": pb.PROPOSAL_ORIGIN_DISTILL_SKILL}


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"name": ""}, "name", "FIELD_REQUIRED"),
        ({"summary": ""}, "summary", "FIELD_REQUIRED"),
        ({"summary": "s" * 1001}, "summary", "FIELD_TOO_LONG"),
        ({"body": ""}, "body", "FIELD_REQUIRED"),
        ({"tool_sequence": []}, "tool_sequence", "FIELD_REQUIRED"),
        ({"tool_sequence": ["a", ""]}, "tool_sequence[1]", "FIELD_REQUIRED"),
        ({"tool_sequence": ["x" * 201]}, "tool_sequence[0]", "FIELD_TOO_LONG"),
        ({"tool_sequence": [f"t{i}" for i in range(501)]}, "tool_sequence", "FIELD_TOO_LONG"),
        ({"origin": pb.PROPOSAL_ORIGIN_UNSPECIFIED}, "origin", "FIELD_REQUIRED"),
        ({"source": pb.ProposalSource(evidence_ids=[f"e{i}" for i in range(501)])}, "source.evidence_ids",
         "FIELD_TOO_LONG"),
        ({"source": pb.ProposalSource(session_id="s" * 201)}, "source.session_id", "FIELD_TOO_LONG"),
        ({"request_id": "k" * 401}, "request_id", "FIELD_TOO_LONG"),
    ],
)  # fmt: skip
async def test_proposal_limits_are_the_contracts(skills, overrides, field, reason):
    app, stub = skills
    assert await invalid(stub.ProposeSkill(pb.ProposeSkillRequest(**{**PROPOSAL, **overrides}))) == (reason, field)
    assert await app.infra.pool.fetchval("SELECT count(*) FROM skill_proposals") == 0


@pytest.mark.parametrize("rpc", ["ApproveSkillProposal", "RejectSkillProposal"])
async def test_decisions_are_checked_by_the_contract(skills, rpc):
    app, stub = skills
    filed = await stub.ProposeSkill(pb.ProposeSkillRequest(**PROPOSAL))
    request_type = getattr(pb, f"{rpc}Request")
    pid = filed.proposal.id
    for kwargs, field, reason in (
        ({"proposal_id": "nope"}, "proposal_id", "FIELD_INVALID"),
        ({"proposal_id": pid, "reviewer": "r" * 201}, "reviewer", "FIELD_TOO_LONG"),
        ({"proposal_id": pid, "reason": "r" * 1001}, "reason", "FIELD_TOO_LONG"),
    ):
        assert await invalid(getattr(stub, rpc)(request_type(**SEAT, **kwargs))) == (reason, field)
    assert await app.infra.pool.fetchval("SELECT state FROM skill_proposals") == "pending"
