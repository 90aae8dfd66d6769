"""Provenance of skills, kept versions and practice bullets, and a person's erasure from them
(issue 17): each part records where it came from; erasing one person removes the parts that rest
only on them (a bullet leaves every body, the skill re-rendered from what remains, no model; a live
refinement only they taught gives way to the kept version before it) and takes their turns and
subject entries out of the parts they share. Real Postgres, real gRPC, the skills' own EraseRows."""

from __future__ import annotations

import uuid

import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2
from agentlearn.common.v1.erasure_pb2 import ErasureSubject
from agentlearn.common.v1.provenance_pb2 import Provenance
from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from tests.support.app import open_app
from tests.support.erasure_checks import subject_target
from tests.support.skills import skill_request

SEAT = {"company": "acme", "seat": "ana"}
CARLA = ErasureSubject(handle="carla", platform="slack")
BOB = ErasureSubject(handle="bob", platform="slack")
BASE = "# open-pr\n\n1. Read the issue.\n2. Open the PR.\n"


@pytest.fixture
async def skills(make_settings, dsn, clock):  # type: ignore[no-untyped-def]
    async with open_app(make_settings(), dsn, names=["skills"], clock=clock) as app:
        yield app, pb_grpc.SkillServiceStub(app.channel)


async def create(stub, turns: list[str], subjects: list[ErasureSubject], body: str = BASE) -> pb.Skill:  # type: ignore[no-untyped-def]
    req = skill_request(
        "ana",
        "open-pr",
        "Open a PR for an issue",
        body,
        ["jira_get_issue", "github_create_pr"],
        turns,
        trigger=pb.SKILL_TRIGGER_CLUSTERED if len(turns) > 1 else pb.SKILL_TRIGGER_SINGLE,
        cluster_size=len(turns) if len(turns) > 1 else 1,
        provenance=Provenance(subjects=subjects, model="draft-model", prompt_version="p1", writer="synthesizer"),
    )
    return (await stub.CreateSkill(req)).skill


async def observe(stub, text: str, turns: list[str], subjects: list[ErasureSubject]) -> pb.Skill:  # type: ignore[no-untyped-def]
    req = pb.AppendSkillObservationRequest(
        **SEAT,
        skill_name="open-pr",
        kind=pb.OBSERVATION_KIND_OBSERVED,
        observation=text,
        turn_id=turns[0],
        provenance=Provenance(turn_ids=turns, subjects=subjects, model="judge-model", prompt_version="j1"),
    )
    return (await stub.AppendSkillObservation(req)).skill


async def erase_carla(stub, turns: list[str], erasure_id: str | None = None) -> erasure_pb2.ErasureReport:  # type: ignore[no-untyped-def]
    target = subject_target("carla", erasure_id or str(uuid.uuid4()), names=["Carla"], turn_ids=turns)
    return (await stub.EraseRows(pb.EraseRowsRequest(target=target))).report


async def provenance(stub, skill_id: str) -> pb.GetSkillProvenanceResponse:  # type: ignore[no-untyped-def]
    return await stub.GetSkillProvenance(pb.GetSkillProvenanceRequest(**SEAT, skill_id=skill_id))


def tables(report: erasure_pb2.ErasureReport) -> dict[str, tuple[int, int]]:
    return {t.table: (t.count, t.changed) for t in report.tables}


async def test_provenance_names_the_draft_each_version_and_each_bullet(skills):
    _, stub = skills
    skill = await create(stub, ["r-b1", "r-c1"], [BOB, CARLA])
    await stub.RefineSkill(
        pb.RefineSkillRequest(
            **SEAT, skill_name="open-pr", body=BASE + "3. Link it.\n", turn_id="r-b2",
            provenance=Provenance(subjects=[BOB], model="m"),
        )
    )  # fmt: skip
    await observe(stub, "check CI first", ["r-c2"], [CARLA])
    got = await provenance(stub, skill.id)
    assert list(got.provenance.turn_ids) == ["r-b1", "r-c1"]
    assert [s.handle for s in got.provenance.subjects] == ["bob", "carla"]
    assert (got.provenance.model, got.provenance.prompt_version, got.provenance.writer) == (
        "draft-model", "p1", "synthesizer")  # fmt: skip
    assert [(v.version, v.change, v.current) for v in got.versions] == [
        (3, pb.SKILL_CHANGE_OBSERVATION_APPENDED, True),
        (2, pb.SKILL_CHANGE_REFINED, False),
        (1, pb.SKILL_CHANGE_CREATED, False),
    ]
    assert [list(v.provenance.turn_ids) for v in got.versions] == [["r-c2"], ["r-b2"], ["r-b1", "r-c1"]]
    assert [v.provenance.writer for v in got.versions] == ["refiner", "refine_skill", "synthesizer"]
    [bullet] = got.bullets
    assert (bullet.version, bullet.text) == (3, "- Observed in practice: check CI first")
    assert [s.handle for s in bullet.provenance.subjects] == ["carla"]
    assert (bullet.provenance.model, bullet.provenance.prompt_version) == ("judge-model", "j1")


async def test_erasing_a_person_takes_their_bullets_out_and_their_part_of_shared_ones(skills):
    app, stub = skills
    skill = await create(stub, ["r-b1", "r-c1"], [BOB, CARLA])
    await observe(stub, "check CI first", ["r-c2"], [CARLA])  # hers alone: goes
    await observe(stub, "link the issue", ["r-b2"], [BOB])  # his: stays
    await observe(stub, "ask for two reviews", ["r-b3", "r-c3"], [BOB, CARLA])  # shared: stays, without her
    before = (await stub.GetSkill(pb.GetSkillRequest(**SEAT, skill_id=skill.id))).skill
    assert "check CI first" in before.body and before.version == 4

    erasure_id = str(uuid.uuid4())
    report = await erase_carla(stub, ["r-c1", "r-c2", "r-c3"], erasure_id)
    assert tables(report)["synthesized_skills"] == (0, 1)
    assert tables(report)["skill_practice_bullets"] == (1, 1)
    assert tables(report)["synthesized_skill_versions"][0] == 1  # the version her bullet made

    after = (await stub.GetSkill(pb.GetSkillRequest(**SEAT, skill_id=skill.id))).skill
    assert after.body == (
        BASE + "\n## What practice added\n\n"
        "- Observed in practice: link the issue\n- Observed in practice: ask for two reviews\n"
    )
    assert list(after.source_turn_ids) == ["r-b1"]
    got = await provenance(stub, skill.id)
    assert [s.handle for s in got.provenance.subjects] == ["bob"]
    assert [b.text for b in got.bullets] == [
        "- Observed in practice: link the issue",
        "- Observed in practice: ask for two reviews",
    ]
    assert [list(b.provenance.turn_ids) for b in got.bullets] == [["r-b2"], ["r-b3"]]
    assert [v.version for v in got.versions] == [4, 3, 1]
    # Nothing of hers in any body or record of the skill, read directly.
    rows = await app.infra.pool.fetch(
        """SELECT body || provenance::text AS t FROM synthesized_skill_versions
           UNION ALL SELECT body || provenance::text || version_provenance::text
                            || array_to_string(source_turn_ids, ' ') FROM synthesized_skills
           UNION ALL SELECT bullet || provenance::text FROM skill_practice_bullets"""
    )
    for row in rows:
        assert "carla" not in row["t"] and "r-c" not in row["t"] and "check CI first" not in row["t"]
    # A repeat of the same erasure (a retry, a resume) erases nothing more and says the same.
    assert await erase_carla(stub, ["r-c1", "r-c2", "r-c3"], erasure_id) == report
    again = (await stub.GetSkill(pb.GetSkillRequest(**SEAT, skill_id=skill.id))).skill
    assert again.body == after.body


async def test_a_refinement_only_they_taught_gives_way_to_the_version_before_it(skills):
    _, stub = skills
    skill = await create(stub, ["r-b1"], [BOB])
    await stub.RefineSkill(
        pb.RefineSkillRequest(
            **SEAT, skill_name="open-pr", body=BASE + "3. Wait for the review.\n", turn_id="r-c9",
            provenance=Provenance(subjects=[CARLA]),
        )
    )  # fmt: skip
    report = await erase_carla(stub, ["r-c9"])
    assert tables(report)["synthesized_skills"] == (0, 1)
    after = (await stub.GetSkill(pb.GetSkillRequest(**SEAT, skill_id=skill.id))).skill
    assert after.body == BASE and list(after.source_turn_ids) == ["r-b1"]
    got = await provenance(stub, skill.id)
    assert [list(v.provenance.turn_ids) for v in got.versions] == [["r-b1"]]


async def test_a_skill_drafted_only_from_them_goes_whatever_came_after(skills):
    app, stub = skills
    skill = await create(stub, ["r-c1"], [CARLA])
    await observe(stub, "link the issue", ["r-b2"], [BOB])
    report = await erase_carla(stub, ["r-c1"])
    assert tables(report)["synthesized_skills"] == (1, 0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await provenance(stub, skill.id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert await app.infra.pool.fetchval("SELECT count(*) FROM skill_practice_bullets") == 0


async def test_after_the_erasure_nothing_of_theirs_is_found_and_a_skill_from_their_session_is_gone(skills):
    _, stub = skills
    shared = await create(stub, ["r-b1", "r-c1"], [BOB, CARLA])
    await observe(stub, "check CI first", ["r-c2"], [CARLA])
    await observe(stub, "ask for two reviews", ["r-b3", "r-c3"], [BOB, CARLA])
    filed = await stub.ProposeSkill(
        pb.ProposeSkillRequest(
            **SEAT, name="triage", summary="Triage a ticket", body="# triage\n\n1. Read it.\n",
            tool_sequence=["jira_search"], origin=pb.PROPOSAL_ORIGIN_SESSION_CHECK,
            source=pb.ProposalSource(session_id="sess-c", check_id="chk-1", evidence_ids=["ev-1"]),
        )
    )  # fmt: skip
    approved = await stub.ApproveSkillProposal(
        pb.ApproveSkillProposalRequest(**SEAT, proposal_id=filed.proposal.id, reviewer="lead")
    )
    got = await provenance(stub, approved.skill.id)
    assert (got.provenance.session_id, got.provenance.check_id, list(got.provenance.event_ids)) == (
        "sess-c", "chk-1", ["ev-1"])  # fmt: skip
    assert got.provenance.writer == "skill_proposal:session_check"

    target = subject_target(
        "carla", str(uuid.uuid4()), names=["Carla"], turn_ids=["r-c1", "r-c2", "r-c3"], session_ids=["sess-c"]
    )
    found = (await stub.FindRows(pb.FindRowsRequest(target=target))).report
    assert tables(found)["synthesized_skills"] == (1, 1) and tables(found)["skill_proposals"] == (1, 0)
    erased = (await stub.EraseRows(pb.EraseRowsRequest(target=target))).report
    assert tables(erased) == tables(found)  # the verification's view and the erasure agree
    target.erasure_id = str(uuid.uuid4())
    assert list((await stub.FindRows(pb.FindRowsRequest(target=target))).report.tables) == []
    listed = await stub.ListSkills(pb.ListSkillsRequest(**SEAT, include_archived=True))
    assert [k.id for k in listed.skills] == [shared.id]


async def test_a_one_letter_handle_is_found_by_the_provenance_s_subjects_without_her_run_ids(skills):
    """Her handle "q" is too short for a text match, and her run ids were not collected: the skill
    is still found by its provenance's subjects (compared exactly, as proposals are), her bullet
    goes, her part of the shared draft leaves, and nothing of hers is found after."""
    _, stub = skills
    q = ErasureSubject(handle="q", platform="slack")
    shared = await create(stub, ["r-b1", "r-q1"], [BOB, q])
    await observe(stub, "check CI first", ["r-q2"], [q])
    target = subject_target("q", str(uuid.uuid4()))
    found = (await stub.FindRows(pb.FindRowsRequest(target=target))).report
    assert tables(found)["synthesized_skills"] == (0, 1) and tables(found)["skill_practice_bullets"] == (1, 0)
    erased = (await stub.EraseRows(pb.EraseRowsRequest(target=target))).report
    assert tables(erased) == tables(found)
    target.erasure_id = str(uuid.uuid4())
    assert list((await stub.FindRows(pb.FindRowsRequest(target=target))).report.tables) == []
    got = await provenance(stub, shared.id)
    assert [s.handle for s in got.provenance.subjects] == ["bob"] and list(got.bullets) == []
    assert all(s.handle != "q" for v in got.versions for s in v.provenance.subjects)


async def test_the_use_keys_of_her_turns_go_with_her_and_are_counted(skills):
    """MarkSkillsUsed's idempotency key of a turn of hers (``<run id>:skill_use``) is found, erased
    and counted in the receipt (a digest); another turn's key stays, even one whose run id starts
    with hers."""
    app, stub = skills
    skill = await create(stub, ["r-b1"], [BOB])
    for key in ("r-c9:skill_use", "r-c90:skill_use", "r-b9:skill_use"):
        await stub.MarkSkillsUsed(pb.MarkSkillsUsedRequest(**SEAT, skill_ids=[skill.id], request_id=key))
    target = subject_target("carla", str(uuid.uuid4()), turn_ids=["r-c9"])
    found = (await stub.FindRows(pb.FindRowsRequest(target=target))).report
    assert tables(found) == {"skill_use_requests": (1, 0)}
    [digest] = [i for t in found.tables for i in t.ids]
    assert "r-c9" not in digest  # the receipt never keeps the key
    erased = (await stub.EraseRows(pb.EraseRowsRequest(target=target))).report
    assert tables(erased) == tables(found)
    keys = await app.infra.pool.fetch("SELECT request_id FROM skill_use_requests ORDER BY request_id")
    assert [k["request_id"] for k in keys] == ["r-b9:skill_use", "r-c90:skill_use"]
    target.erasure_id = str(uuid.uuid4())
    assert list((await stub.FindRows(pb.FindRowsRequest(target=target))).report.tables) == []
