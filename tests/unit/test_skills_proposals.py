"""Skill proposals on the in-memory stores: filing with the exact and tool-set duplicate checks,
approval through CreateSkill's path (idempotent), rejection suppressing a matching candidate. No
Postgres, no model (no embedder: the semantic check is reported as not run), no gRPC."""

from __future__ import annotations

from typing import Any

import pytest

from libs.common.config import SkillSynthesisConfig
from libs.common.errors import AlreadyExists, FailedPrecondition, NotFound, ResourceExhausted
from services.skills.domain import (
    DuplicateCheck,
    ProposalDisposition,
    ProposalOrigin,
    ProposalState,
    SkillKey,
    SkillState,
)
from services.skills.proposals import ProposalResult
from tests.unit.fakes.skills import Skills, make


async def propose(s: Skills, name: str = "open-pr", tools: list[str] | None = None, **kw: Any) -> ProposalResult:
    s.clock.advance(seconds=1)
    return await s.proposals.propose(
        "acme",
        "ana",
        name=name,
        summary=f"Use for {name}",
        body=kw.pop("body", f"# {name}\n"),
        tool_sequence=tools or ["jira_get_issue", "github_create_pr"],
        origin=ProposalOrigin.SESSION_CHECK,
        session_id="sess-1",
        check_id="chk-1",
        evidence_ids=["ev-1", "ev-2"],
        **kw,
    )


async def test_a_proposal_is_filed_pending_and_a_retry_with_its_key_returns_it():
    s = make()
    filed = await propose(s, request_id="p-1")
    assert filed.disposition is ProposalDisposition.CREATED and filed.proposal is not None
    assert filed.proposal.state is ProposalState.PENDING and filed.proposal.evidence_ids == ("ev-1", "ev-2")
    assert DuplicateCheck.EMBEDDING not in filed.checks_run  # no embedder
    again = await propose(s, request_id="p-1")
    assert again.disposition is ProposalDisposition.ALREADY_PROPOSED and again.proposal == filed.proposal
    assert not s.store.rows  # a proposal is never a live skill by itself


async def test_duplicates_of_a_live_skill_or_a_pending_proposal_are_not_filed():
    s = make()
    await s.create("open-pr", tools=["jira_get_issue", "github_create_pr"])
    dup = await propose(s, "open-pr-v2")
    assert dup.disposition is ProposalDisposition.DUPLICATE_SKILL and dup.match is not None
    assert dup.match.check is DuplicateCheck.TOOL_SET
    await propose(s, "triage", tools=["jira_search"])
    same = await propose(s, "Triage ", tools=["slack_post"])
    assert same.disposition is ProposalDisposition.DUPLICATE_PROPOSAL
    assert same.match is not None and same.match.check is DuplicateCheck.EXACT_NAME


async def test_approval_creates_the_skill_once_and_names_it():
    s = make()
    filed = await propose(s)
    assert filed.proposal is not None
    pid = str(filed.proposal.id)
    proposal, skill = await s.proposals.approve("acme", "ana", pid, "lead", "good")
    assert proposal.state is ProposalState.APPROVED and proposal.skill_id == skill.id
    assert (skill.name, skill.state, skill.source_turn_ids) == ("open-pr", SkillState.ACTIVE, ("session:sess-1",))
    again, same = await s.proposals.approve("acme", "ana", pid, "lead", "good")
    assert again.state is ProposalState.APPROVED and same.id == skill.id and len(s.store.rows) == 1
    with pytest.raises(FailedPrecondition) as err:
        await s.proposals.reject("acme", "ana", pid, "lead", "")
    assert err.value.reason == "PROPOSAL_APPROVED"
    assert s.events.kinds().count("skill_proposal_approved") == 1


async def test_a_rejected_proposal_suppresses_its_match_and_is_never_approved():
    s = make()
    filed = await propose(s, "triage", tools=["jira_search"])
    assert filed.proposal is not None
    pid = str(filed.proposal.id)
    rejected = await s.proposals.reject("acme", "ana", pid, "lead", "not useful")
    assert rejected.state is ProposalState.REJECTED and rejected.decision_reason == "not useful"
    assert (await s.proposals.reject("acme", "ana", pid, "lead", "")).state is ProposalState.REJECTED
    with pytest.raises(FailedPrecondition) as err:
        await s.proposals.approve("acme", "ana", pid, "lead", "")
    assert err.value.reason == "PROPOSAL_REJECTED"
    suppressed = await propose(s, "triage-again", tools=["jira_search"])
    assert suppressed.disposition is ProposalDisposition.SUPPRESSED
    assert not s.store.rows


async def test_an_unknown_proposal_is_not_found_and_listing_is_newest_first():
    s = make()
    with pytest.raises(NotFound):
        await s.proposals.approve("acme", "ana", "00000000-0000-0000-0000-000000000001", "", "")
    for name, tool in (("a", "t1"), ("b", "t2"), ("c", "t3")):
        await propose(s, name, tools=[tool])
    page, token = await s.proposals.list("acme", "ana", None, 2, "")
    assert [p.name for p in page] == ["c", "b"] and token
    page, token = await s.proposals.list("acme", "ana", None, 2, token)
    assert [p.name for p in page] == ["a"] and token == ""


async def test_a_candidate_named_like_an_archived_skill_is_refused_not_filed_for_ever():
    """A name stays the seat's after archiving (approval's SKILL_NAME_TAKEN), so filing it would
    leave a proposal no one can approve: refused, naming the field and the archived holder."""
    s = make()
    archived = await s.create("open-pr", tools=["jira_get_issue", "github_create_pr"])
    await s.service.archive(SkillKey("acme", "ana", id=archived.id))
    with pytest.raises(AlreadyExists) as taken:
        await propose(s, "open-pr", tools=["slack_post"], body="# a different body\n")
    assert (taken.value.reason, taken.value.metadata["field"]) == ("SKILL_NAME_TAKEN", "name")
    assert taken.value.metadata["state"] == "archived" and taken.value.metadata["skill_id"] == str(archived.id)
    assert not s.proposal_store.rows and "skill_proposed" not in s.events.kinds()
    # The name is checked before the proposals: a rejected look-alike would answer SUPPRESSED, and
    # the proposer would not learn that the name, not the candidate, is what can never pass.
    rejected = await propose(s, "notify", tools=["slack_post"])
    assert rejected.proposal is not None
    await s.proposals.reject("acme", "ana", str(rejected.proposal.id), "lead", "no")
    with pytest.raises(AlreadyExists):
        await propose(s, "open-pr", tools=["slack_post"], body="# a different body\n")
    # Renamed (and unlike the rejected one), the candidate is filed and approvable.
    renamed = await propose(s, "open-pr-slack", tools=["slack_post", "github_get_pr"], body="# a different body\n")
    assert renamed.disposition is ProposalDisposition.CREATED and renamed.proposal is not None
    _, skill = await s.proposals.approve("acme", "ana", str(renamed.proposal.id), "lead", "ok")
    assert skill.name == "open-pr-slack" and skill.state is SkillState.ACTIVE
    # A live skill with the name is still the duplicate it always was (nothing filed, not refused).
    dup = await propose(s, "open-pr-slack", tools=["pagerduty"], body="# other\n")
    assert dup.disposition is ProposalDisposition.DUPLICATE_SKILL and dup.match is not None
    assert dup.match.skill_id == skill.id


async def test_what_makes_a_pending_proposal_unapprovable_is_said_at_approval_and_it_stays_pending():
    s = make(synthesis=SkillSynthesisConfig(max_skills_per_agent=1))
    filed = await propose(s, "open-pr", tools=["slack_post"], body="# proposed\n")
    assert filed.proposal is not None
    pid = str(filed.proposal.id)
    # A skill under the name, drafted another way after the proposal: named, with its state.
    other = await s.create("open-pr", tools=["jira_get_issue"])
    with pytest.raises(AlreadyExists) as taken:
        await s.proposals.approve("acme", "ana", pid, "lead", "")
    assert (taken.value.reason, taken.value.metadata["field"]) == ("SKILL_NAME_TAKEN", "name")
    assert (taken.value.metadata["skill_id"], taken.value.metadata["state"]) == (str(other.id), "active")
    # Archived, it still holds the name (and is missing from the default listing): said so.
    await s.service.archive(SkillKey("acme", "ana", id=other.id))
    with pytest.raises(AlreadyExists) as taken:
        await s.proposals.approve("acme", "ana", pid, "lead", "")
    assert taken.value.metadata["state"] == "archived" and "archived" in taken.value.message
    assert (await s.proposals.get("acme", "ana", pid)).state is ProposalState.PENDING
    # A full catalogue refuses with its numbers; the proposal waits and is approved once there is room.
    later = await propose(s, "triage", tools=["jira_search"])
    assert later.proposal is not None
    await s.create("deploy", tools=["kubectl"])
    with pytest.raises(ResourceExhausted) as full:
        await s.proposals.approve("acme", "ana", str(later.proposal.id), "lead", "")
    assert full.value.reason == "SKILL_CATALOGUE_FULL" and full.value.metadata["limit"] == "1"
    assert (await s.proposals.get("acme", "ana", str(later.proposal.id))).state is ProposalState.PENDING
    deploy = await s.service.get(s.key("deploy"))
    await s.service.archive(SkillKey("acme", "ana", id=deploy.id))
    approved, skill = await s.proposals.approve("acme", "ana", str(later.proposal.id), "lead", "")
    assert approved.state is ProposalState.APPROVED and skill.name == "triage"
