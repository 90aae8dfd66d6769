"""The catalogue: the pre-draft gates, CreateSkill and its refusals, listing, reading, using (with
revival in the same write), offers moving the staleness clock, telemetry failures, learning health.
Real Postgres, real gRPC."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest

from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from services.skills import passes
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.skills import create_skill

TOOLS = ["jira_get_issue", "github_search", "github_create_branch", "github_create_pr"]


@pytest.fixture
async def skills(make_settings, dsn, clock):
    async with open_app(make_settings(), dsn, names=["skills"], clock=clock) as app:
        yield app, pb_grpc.SkillServiceStub(app.channel)


def body_of(name: str) -> str:
    return f"---\nname: {name}\ndescription: does {name}\n---\n# {name}\n\n## Steps\n\n1. Do it.\n"


async def create(stub, name, tools=TOOLS, *, clock=None, **kw):  # type: ignore[no-untyped-def]
    if clock is not None:
        clock.advance(seconds=1)
    kw.setdefault("body", body_of(name))
    return await create_skill(stub, name, tools, **kw)


async def refused(call):  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return error_info(exc.value)


def dt(ts):  # type: ignore[no-untyped-def]
    from datetime import UTC

    return ts.ToDatetime().replace(tzinfo=UTC)


# ----------------------------------------------------------------------------------------- create


async def test_create_stores_the_draft_verbatim_and_announces_it(skills, clock):
    app, stub = skills
    body = "---\nname: open-pr\n---\n\n  Ünïcödé steps, kept exactly.  \n\n1. `github_create_pr`\n"
    skill = await create(stub, "open-pr", body=body, source_turn_ids=["run-7"])
    assert skill.body == body and skill.body_chars == len(body)
    assert list(skill.tool_sequence) == TOOLS
    assert skill.state == pb.SKILL_STATE_ACTIVE and skill.version == 1 and skill.use_count == 0
    assert skill.trigger == pb.SKILL_TRIGGER_SINGLE and skill.cluster_size == 1
    assert dt(skill.create_time) == clock.now() and dt(skill.unused_since_time) == clock.now()
    [event] = await read_events(app.infra.pool, "skill_synthesized")
    assert event["seat"] == "ana" and event["turn_id"] == "run-7"
    assert event["payload"]["trigger"] == "single" and event["payload"]["cluster_size"] == 1
    assert event["payload"]["skill_id"] == skill.id


async def test_a_clustered_draft_carries_its_size_and_no_turn_id(skills):
    app, stub = skills
    skill = await create(
        stub, "triage", trigger=pb.SKILL_TRIGGER_CLUSTERED, cluster_size=4, source_turn_ids=["r1", "r2", "r3", "r4"]
    )
    assert skill.cluster_size == 4 and list(skill.source_turn_ids) == ["r1", "r2", "r3", "r4"]
    [event] = await read_events(app.infra.pool, "skill_synthesized")
    assert event["turn_id"] is None
    assert event["payload"]["trigger"] == "clustered" and event["payload"]["cluster_size"] == 4


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"name": ""}, "name", "FIELD_REQUIRED"),
        ({"name": "   "}, "name", "FIELD_REQUIRED"),
        ({"name": "x" * 101}, "name", "FIELD_INVALID"),
        ({"name": "two\nlines"}, "name", "FIELD_INVALID"),
        ({"summary": ""}, "summary", "FIELD_REQUIRED"),
        ({"summary": "s" * 1001}, "summary", "FIELD_TOO_LONG"),
        ({"body": ""}, "body", "FIELD_REQUIRED"),
        ({"tool_sequence": []}, "tool_sequence", "FIELD_REQUIRED"),
        ({"tool_sequence": ["a", ""]}, "tool_sequence[1]", "FIELD_REQUIRED"),
        ({"trigger": pb.SKILL_TRIGGER_UNSPECIFIED}, "trigger", "FIELD_REQUIRED"),
        ({"trigger": 9}, "trigger", "FIELD_INVALID"),
        ({"source_turn_ids": []}, "source_turn_ids", "FIELD_INVALID"),
        ({"source_turn_ids": ["a", "b"]}, "source_turn_ids", "FIELD_INVALID"),
        ({"cluster_size": 3}, "cluster_size", "FIELD_INVALID"),
        ({"trigger": pb.SKILL_TRIGGER_CLUSTERED, "cluster_size": 1}, "cluster_size", "FIELD_INVALID"),
        ({"trigger": pb.SKILL_TRIGGER_CLUSTERED, "cluster_size": 3, "source_turn_ids": []}, "source_turn_ids",
         "FIELD_REQUIRED"),
        ({"seat": ""}, "seat", "FIELD_REQUIRED"),
        ({"company": "bad handle!"}, "company", "FIELD_INVALID"),
    ],
)  # fmt: skip
async def test_create_refuses_a_draft_with_a_gap_naming_the_field(skills, overrides, field, reason):
    app, stub = skills
    req = {
        "company": "acme",
        "seat": "ana",
        "name": "open-pr",
        "summary": "s",
        "body": "b",
        "tool_sequence": TOOLS,
        "trigger": pb.SKILL_TRIGGER_SINGLE,
        "source_turn_ids": ["run-1"],
        **overrides,
    }
    code, info, bad = await refused(stub.CreateSkill(pb.CreateSkillRequest(**req)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == reason and info.domain == "skills.agentlearn.dev"
    assert bad.field_violations[0].field == field
    assert await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skills") == 0


async def test_a_body_of_twenty_thousand_characters_is_the_limit_and_past_it_is_refused(skills):
    app, stub = skills
    ok = await create(stub, "big", body="x" * 20_000)
    assert ok.body_chars == 20_000
    code, info, bad = await refused(create(stub, "bigger", ["other_tool"], body="y" * 20_001))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "SKILL_BODY_TOO_LONG"
    assert bad.field_violations[0].field == "body"
    assert info.metadata["limit"] == "20000" and info.metadata["length"] == "20001"
    assert await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skills") == 1


async def test_a_name_the_seat_already_has_is_refused_even_when_archived(skills):
    _, stub = skills
    first = await create(stub, "open-pr")
    code, info, bad = await refused(create(stub, "open-pr", ["slack_post"]))
    assert code == grpc.StatusCode.ALREADY_EXISTS and info.reason == "SKILL_NAME_TAKEN"
    assert bad.field_violations[0].field == "name" and info.metadata["name"] == "open-pr"
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=first.id))
    code, info, _ = await refused(create(stub, " open-pr ", ["slack_post"]))  # surrounding spaces dropped
    assert code == grpc.StatusCode.ALREADY_EXISTS and info.reason == "SKILL_NAME_TAKEN"
    # Another seat may use the name: skills are agent-scope.
    assert (await create(stub, "open-pr", seat="bob")).seat == "bob"


# ------------------------------------------------------------------------------------------ gates


async def test_the_duplicate_check_compares_tool_sets_not_runs(skills):
    _, stub = skills
    existing = await create(stub, "open-pr", ["a", "b", "c", "d"])
    # Same four tools in another order, one repeated: the same procedure.
    check = await stub.CheckSkillCandidate(
        pb.CheckSkillCandidateRequest(company="acme", seat="ana", tool_set=["d", "c", "b", "a", "a"])
    )
    assert check.gate == pb.CANDIDATE_GATE_DUPLICATE
    assert check.duplicate.name == "open-pr" and check.duplicate.id == existing.id
    assert check.duplicate.similarity == pytest.approx(1.0) and check.duplicate_threshold == pytest.approx(0.8)
    code, info, bad = await refused(create(stub, "open-pr-again", ["d", "c", "b", "a"]))
    assert code == grpc.StatusCode.ALREADY_EXISTS and info.reason == "SKILL_DUPLICATE_TOOL_SET"
    assert info.metadata["duplicate_skill_name"] == "open-pr" and info.metadata["duplicate_skill_id"] == existing.id
    assert bad.field_violations[0].field == "tool_sequence"
    # At the threshold is a duplicate (4/5 = 0.8); below it is not (4/6).
    at = await stub.CheckSkillCandidate(
        pb.CheckSkillCandidateRequest(company="acme", seat="ana", tool_set=["a", "b", "c", "d", "e"])
    )
    assert at.gate == pb.CANDIDATE_GATE_DUPLICATE and at.duplicate.similarity == pytest.approx(0.8)
    below = await stub.CheckSkillCandidate(
        pb.CheckSkillCandidateRequest(company="acme", seat="ana", tool_set=["a", "b", "c", "d", "e", "f"])
    )
    assert below.gate == pb.CANDIDATE_GATE_OPEN and not below.HasField("duplicate")
    assert (await create(stub, "wider", ["f", "e", "d", "c", "b", "a"])).name == "wider"


async def test_the_duplicate_check_reads_the_seats_own_skills_archived_ones_included(skills):
    """Another seat's skill is never a duplicate; the seat's own archived skill is (it is learned:
    restoring it is an operator's RestoreSkill, not a re-synthesis under a new name)."""
    _, stub = skills
    await create(stub, "theirs", ["a", "b"], seat="bob")
    archived = await create(stub, "old", ["x", "y"])
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=archived.id))
    theirs = await stub.CheckSkillCandidate(
        pb.CheckSkillCandidateRequest(company="acme", seat="ana", tool_set=["a", "b"])
    )
    assert theirs.gate == pb.CANDIDATE_GATE_OPEN
    old = await stub.CheckSkillCandidate(pb.CheckSkillCandidateRequest(company="acme", seat="ana", tool_set=["y", "x"]))
    assert old.gate == pb.CANDIDATE_GATE_DUPLICATE
    assert (old.duplicate.name, old.duplicate.state) == ("old", pb.SKILL_STATE_ARCHIVED)
    assert old.live_skill_count == 0  # the cap still counts live skills only
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await create(stub, "old-again", ["x", "y"])
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_a_full_catalogue_closes_the_cap_gate_first(make_settings, dsn, clock):
    settings = make_settings(learning={"skill_synthesis": {"max_skills_per_agent": 2}})
    async with open_app(settings, dsn, names=["skills"], clock=clock) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        first = await create(stub, "one", ["a"])
        await create(stub, "two", ["b"])
        # A duplicate of "one" into a full catalogue: the cap is what is reported, and the
        # duplicate is named beside it (a retried draft finds its own skill by it).
        check = await stub.CheckSkillCandidate(
            pb.CheckSkillCandidateRequest(company="acme", seat="ana", tool_set=["a"])
        )
        assert check.gate == pb.CANDIDATE_GATE_CATALOGUE_FULL
        assert (check.duplicate.id, check.duplicate.similarity) == (first.id, 1.0)
        assert check.live_skill_count == 2 and check.max_skills == 2
        code, info, _ = await refused(create(stub, "three", ["c"]))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.reason == "SKILL_CATALOGUE_FULL"
        assert info.metadata["limit"] == "2" and info.metadata["live_skills"] == "2"
        # Another seat's catalogue is its own.
        assert (await create(stub, "three", ["c"], seat="bob")).name == "three"
        # An archived skill leaves the catalogue: the cap counts live (active and stale) skills.
        await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=first.id))
        assert (await create(stub, "three", ["c"])).name == "three"
        # ... and restoring it into the full catalogue again is refused.
        code, info, _ = await refused(
            stub.RestoreSkill(pb.RestoreSkillRequest(company="acme", seat="ana", skill_id=first.id))
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.reason == "SKILL_CATALOGUE_FULL"


async def test_two_drafts_racing_for_the_last_slot_cannot_both_pass_the_cap(make_settings, dsn, clock):
    settings = make_settings(learning={"skill_synthesis": {"max_skills_per_agent": 3}})
    async with open_app(settings, dsn, names=["skills"], clock=clock) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub, "one", ["a"])
        await create(stub, "two", ["b"])
        results = await asyncio.gather(
            *(create(stub, f"racer-{i}", [f"tool-{i}"]) for i in range(4)), return_exceptions=True
        )
        won = [r for r in results if not isinstance(r, Exception)]
        lost = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert len(won) == 1 and len(lost) == 3
        assert {e.code() for e in lost} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skills") == 3


async def test_check_candidate_refuses_an_empty_tool_set(skills):
    _, stub = skills
    code, info, bad = await refused(stub.CheckSkillCandidate(pb.CheckSkillCandidateRequest(company="acme", seat="ana")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_REQUIRED"
    assert bad.field_violations[0].field == "tool_set"


# ------------------------------------------------------------------------------------ list and get


async def test_list_shows_active_and_stale_hides_archived_and_pages_by_name(skills, clock):
    app, stub = skills
    names = ["delta", "alpha", "echo", "charlie", "bravo"]
    made = {n: await create(stub, n, [n], clock=clock) for n in names}
    clock.advance(days=31)
    fresh = await create(stub, "foxtrot", ["foxtrot"])
    await passes.curate(app.components["skills"].service)  # the first five go stale
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=made["echo"].id))
    seen, token = [], ""
    while True:
        page = await stub.ListSkills(pb.ListSkillsRequest(company="acme", seat="ana", page_size=2, page_token=token))
        assert page.total_size == 5
        seen += list(page.skills)
        token = page.next_page_token
        if not token:
            break
    assert [s.name for s in seen] == ["alpha", "bravo", "charlie", "delta", "foxtrot"]
    by_name = {s.name: s for s in seen}
    # The ageing marker: a stale skill says so, and for how long it has gone unused.
    assert by_name["alpha"].state == pb.SKILL_STATE_STALE and by_name["alpha"].days_unused == 31
    assert by_name["foxtrot"].state == pb.SKILL_STATE_ACTIVE and by_name["foxtrot"].days_unused == 0
    # The menu view carries no body, only its size.
    assert by_name["alpha"].body == "" and by_name["alpha"].body_chars == len(body_of("alpha"))
    everything = await stub.ListSkills(
        pb.ListSkillsRequest(company="acme", seat="ana", include_archived=True, view=pb.SKILL_VIEW_FULL)
    )
    assert everything.total_size == 6 and everything.next_page_token == ""
    assert {s.name: s.state for s in everything.skills}["echo"] == pb.SKILL_STATE_ARCHIVED
    assert all(s.body == body_of(s.name) for s in everything.skills)
    assert fresh.name == "foxtrot"


async def test_list_page_tokens_are_checked(skills, clock):
    _, stub = skills
    for n in ("a", "b", "c"):
        await create(stub, n, [n], clock=clock)
    page = await stub.ListSkills(pb.ListSkillsRequest(company="acme", seat="ana", page_size=1))
    for bad_request in (
        pb.ListSkillsRequest(company="acme", seat="ana", page_token="garbage"),
        pb.ListSkillsRequest(company="acme", seat="ana", page_token=page.next_page_token, include_archived=True),
        pb.ListSkillsRequest(company="acme", seat="bob", page_token=page.next_page_token),
        pb.ListSkillsRequest(company="acme", seat="ana", page_size=-1),
    ):
        code, info, bad = await refused(stub.ListSkills(bad_request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.reason in {"PAGE_TOKEN_INVALID", "PAGE_SIZE_INVALID"}
        assert bad.field_violations[0].field in {"page_token", "page_size"}


async def test_get_by_id_or_name_reads_any_state_and_is_not_a_use(skills):
    _, stub = skills
    skill = await create(stub, "open-pr")
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_name="open-pr"))
    by_id = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=skill.id))).skill
    by_name = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_name="open-pr"))).skill
    assert by_id == by_name
    assert by_id.state == pb.SKILL_STATE_ARCHIVED and by_id.body == skill.body and by_id.use_count == 0


@pytest.mark.parametrize(
    ("request_kwargs", "code", "reason", "field"),
    [
        # Exactly one of the two: the request's oneof rule in the contract names the first field.
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "ONE_OF_REQUIRED", "skill_id"),
        ({"skill_id": "not-a-uuid"}, grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID", "skill_id"),
        (
            {"skill_id": "00000000-0000-0000-0000-000000000001", "skill_name": "y"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "ONE_OF_REQUIRED",
            "skill_id",
        ),
        ({"skill_name": "nope"}, grpc.StatusCode.NOT_FOUND, "SKILL_NOT_FOUND", None),
    ],
)
async def test_naming_a_skill_is_checked(skills, request_kwargs, code, reason, field):
    _, stub = skills
    got_code, info, bad = await refused(stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", **request_kwargs)))
    assert got_code == code and info.reason == reason
    assert (bad.field_violations[0].field if bad else None) == field


async def test_another_seats_skill_is_not_found(skills):
    _, stub = skills
    theirs = await create(stub, "open-pr", seat="bob")
    for req in (
        pb.GetSkillRequest(company="acme", seat="ana", skill_id=theirs.id),
        pb.GetSkillRequest(company="other", seat="bob", skill_name="open-pr"),
    ):
        code, info, _ = await refused(stub.GetSkill(req))
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "SKILL_NOT_FOUND"
    code, _, _ = await refused(stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_id=theirs.id)))
    assert code == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------------------------------- use


async def test_use_returns_the_body_verbatim_and_counts_the_use(skills, clock):
    app, stub = skills
    skill = await create(stub, "open-pr")
    clock.advance(hours=3)
    resp = await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr", turn_id="run-9"))
    assert resp.skill.body == skill.body and resp.revived is False and resp.telemetry_write_failed is False
    assert resp.skill.use_count == 1 and dt(resp.skill.last_used_time) == clock.now()
    assert dt(resp.skill.unused_since_time) == clock.now()
    await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_id=skill.id))
    got = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=skill.id))).skill
    assert got.use_count == 2
    events = await read_events(app.infra.pool, "skill_used")
    assert len(events) == 2 and events[0]["turn_id"] == "run-9"
    assert events[0]["payload"]["source_kind"] == "synthesized" and events[0]["payload"]["skill_id"] == skill.id


async def test_an_archived_skill_is_refused_to_use_and_keeps_its_count(skills):
    app, stub = skills
    skill = await create(stub, "open-pr")
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=skill.id))
    code, info, _ = await refused(stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "SKILL_ARCHIVED"
    assert info.metadata["skill_name"] == "open-pr"
    assert await app.infra.pool.fetchval("SELECT use_count FROM synthesized_skills") == 0
    assert await read_events(app.infra.pool, "skill_used") == []


async def test_using_a_stale_skill_revives_it_with_the_use(skills, clock):
    app, stub = skills
    skill = await create(stub, "open-pr")
    clock.advance(days=30)
    await passes.curate(app.components["skills"].service)
    assert (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=skill.id))).skill.state == (
        pb.SKILL_STATE_STALE
    )
    clock.advance(days=1)
    resp = await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr", turn_id="run-2"))
    assert resp.revived is True
    assert resp.skill.state == pb.SKILL_STATE_ACTIVE and resp.skill.use_count == 1
    assert dt(resp.skill.state_change_time) == clock.now()
    row = await app.infra.pool.fetchrow("SELECT state, use_count, last_used_time FROM synthesized_skills")
    assert (row["state"], row["use_count"], row["last_used_time"]) == ("active", 1, clock.now())
    [revived] = await read_events(app.infra.pool, "skill_revived")
    assert revived["payload"]["cause"] == "used" and revived["turn_id"] == "run-2"
    assert len(await read_events(app.infra.pool, "skill_used")) == 1
    # Back in the very next listing, with no curator tick in between.
    listed = (await stub.ListSkills(pb.ListSkillsRequest(company="acme", seat="ana"))).skills
    assert [(s.name, s.state) for s in listed] == [("open-pr", pb.SKILL_STATE_ACTIVE)]


async def test_revival_is_part_of_the_use_write_not_a_separate_one(skills, clock):
    """When the use cannot be written, the skill is not revived either (one write), and the body is
    still returned with the failure announced rather than swallowed."""
    app, stub = skills
    skill = await create(stub, "open-pr")
    clock.advance(days=30)
    await passes.curate(app.components["skills"].service)
    # The database refuses any use count but zero: the use's write fails as a whole.
    await app.infra.pool.execute(
        "ALTER TABLE synthesized_skills ADD CONSTRAINT no_uses CHECK (use_count = 0) NOT VALID"
    )
    resp = await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr", turn_id="run-3"))
    assert resp.skill.body == skill.body and resp.telemetry_write_failed is True and resp.revived is False
    row = await app.infra.pool.fetchrow("SELECT state, use_count FROM synthesized_skills")
    assert (row["state"], row["use_count"]) == ("stale", 0)
    [failed] = await read_events(app.infra.pool, "skill_telemetry_write_failed")
    assert failed["payload"]["write"] == "skill_used" and failed["payload"]["skill_names"] == ["open-pr"]
    assert "no_uses" in failed["payload"]["error"]
    assert await read_events(app.infra.pool, "skill_revived") == []
    # The resolution is still published: the counter and the event are separate writes.
    [used] = await read_events(app.infra.pool, "skill_used")
    assert used["payload"]["source_kind"] == "synthesized" and used["turn_id"] == "run-3"


# ----------------------------------------------------------------------------------------- offers


async def test_an_offer_moves_the_clock_of_exactly_the_offered_skills(skills, clock):
    app, stub = skills
    a = await create(stub, "a", ["a"])
    await create(stub, "b", ["b"])
    c = await create(stub, "c", ["c"])
    theirs = await create(stub, "a", ["a"], seat="bob")
    clock.advance(days=20)
    offered_at = clock.now()
    resp = await stub.MarkSkillsOffered(
        pb.MarkSkillsOfferedRequest(company="acme", seat="ana", skill_ids=[a.id, theirs.id], skill_names=["b", "zz"])
    )
    assert resp.marked_count == 2 and resp.telemetry_write_failed is False and resp.telemetry_failure == ""
    rows = {
        (r["seat"], r["name"]): r
        for r in await app.infra.pool.fetch(
            "SELECT seat, name, unused_since, last_offered_time, use_count FROM synthesized_skills"
        )
    }
    for name in ("a", "b"):
        assert rows[("ana", name)]["unused_since"] == offered_at
        assert rows[("ana", name)]["last_offered_time"] == offered_at
    assert rows[("ana", "c")]["last_offered_time"] is None
    assert rows[("ana", "c")]["unused_since"] == offered_at - timedelta(days=20)
    assert rows[("bob", "a")]["last_offered_time"] is None  # another seat's id moves nothing
    assert all(r["use_count"] == 0 for r in rows.values())  # an offer is not a use
    # Fifteen days on, only the skill nobody offered has been unused for thirty.
    clock.advance(days=15)
    await passes.curate(app.components["skills"].service)
    states = {s.name: s.state for s in (await stub.ListSkills(pb.ListSkillsRequest(company="acme", seat="ana"))).skills}
    assert states == {"a": pb.SKILL_STATE_ACTIVE, "b": pb.SKILL_STATE_ACTIVE, "c": pb.SKILL_STATE_STALE}
    assert c.name == "c"


async def test_an_offer_revives_a_stale_skill_but_not_an_archived_one(skills, clock):
    app, stub = skills
    await create(stub, "stale-one", ["a"])
    gone = await create(stub, "gone", ["b"])
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=gone.id))
    clock.advance(days=30)
    await passes.curate(app.components["skills"].service)
    resp = await stub.MarkSkillsOffered(
        pb.MarkSkillsOfferedRequest(company="acme", seat="ana", skill_names=["stale-one", "gone"], turn_id="run-4")
    )
    assert resp.marked_count == 1 and list(resp.revived_skill_names) == ["stale-one"]
    states = dict(await app.infra.pool.fetch("SELECT name, state FROM synthesized_skills"))
    assert states == {"stale-one": "active", "gone": "archived"}
    [event] = await read_events(app.infra.pool, "skill_revived")
    assert event["payload"]["cause"] == "offered" and event["turn_id"] == "run-4"


async def test_an_offer_stamp_that_cannot_be_written_is_reported_not_raised(skills, clock):
    app, stub = skills
    await create(stub, "a", ["a"])
    await create(stub, "b", ["b"])
    before = await app.infra.pool.fetchval("SELECT max(unused_since) FROM synthesized_skills")
    # The database refuses every offer stamp from now on.
    await app.infra.pool.execute(
        "ALTER TABLE synthesized_skills ADD CONSTRAINT offers_refused CHECK (last_offered_time IS NULL) NOT VALID"
    )
    clock.advance(days=1)
    resp = await stub.MarkSkillsOffered(
        pb.MarkSkillsOfferedRequest(company="acme", seat="ana", skill_names=["a", "b"], turn_id="run-5")
    )
    assert resp.telemetry_write_failed is True and "offers_refused" in resp.telemetry_failure
    assert resp.marked_count == 0
    [event] = await read_events(app.infra.pool, "skill_telemetry_write_failed")
    assert event["seat"] == "ana" and event["turn_id"] == "run-5"
    assert event["payload"]["write"] == "skill_offered" and event["payload"]["skill_names"] == ["a", "b"]
    assert await app.infra.pool.fetchval("SELECT max(unused_since) FROM synthesized_skills") == before


@pytest.mark.parametrize("fault", ["pool_closed", "reconnect_refused"])
async def test_an_unreachable_store_is_a_failed_offer_stamp_logged_every_time_never_an_error(
    skills, dsn, fault, caplog
):
    """The stamp's store gone (a closed pool: InterfaceError; every connection dead and a reconnect
    refused: OSError) is a stamp not written — answered as one and logged on every call, not raised
    as UNAVAILABLE or INTERNAL."""
    app, stub = skills
    await create(stub, "a", ["a"])
    pool = app.infra.pool
    if fault == "pool_closed":
        await pool.close()
    else:
        pool.set_connect_args("postgresql://nobody@127.0.0.1:1/none")  # nothing listens on port 1
        await pool.expire_connections()
    caplog.set_level("WARNING", logger="services.skills.service")
    try:
        for turn in ("run-1", "run-2"):
            resp = await stub.MarkSkillsOffered(
                pb.MarkSkillsOfferedRequest(company="acme", seat="ana", skill_names=["a"], turn_id=turn)
            )
            assert resp.telemetry_write_failed is True and resp.marked_count == 0
            expected = "InterfaceError" if fault == "pool_closed" else "Error"
            assert expected in resp.telemetry_failure
    finally:
        if fault != "pool_closed":
            pool.set_connect_args(dsn)
            await pool.expire_connections()
    warned = [r for r in caplog.records if r.name == "services.skills.service" and "not written" in r.message]
    assert len(warned) == 2  # one per failure, not one per kind
    assert all("skill_offered stamp for acme/ana" in r.getMessage() for r in warned)


async def test_a_failed_use_stamp_is_logged_every_time(skills, caplog):
    app, stub = skills
    await create(stub, "open-pr")
    await app.infra.pool.execute(
        "ALTER TABLE synthesized_skills ADD CONSTRAINT no_uses CHECK (use_count = 0) NOT VALID"
    )
    caplog.set_level("WARNING", logger="services.skills.service")
    for turn in ("run-1", "run-2"):
        resp = await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr", turn_id=turn))
        assert resp.telemetry_write_failed is True
    warned = [r.getMessage() for r in caplog.records if r.name == "services.skills.service"]
    assert len(warned) == 2 and all("skill_used stamp for acme/ana (skills open-pr)" in m for m in warned)
    assert len(await read_events(app.infra.pool, "skill_telemetry_write_failed")) == 2


async def test_offer_refuses_a_malformed_id_naming_its_position(skills):
    _, stub = skills
    code, info, bad = await refused(
        stub.MarkSkillsOffered(pb.MarkSkillsOfferedRequest(company="acme", seat="ana", skill_ids=["nope"]))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and bad.field_violations[0].field == "skill_ids[0]"
    code, info, bad = await refused(
        stub.MarkSkillsOffered(
            pb.MarkSkillsOfferedRequest(company="acme", seat="ana", skill_names=[f"s{i}" for i in range(501)])
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "TOO_MANY_IDS"


# ----------------------------------------------------------------------------------------- health


async def test_learning_health_is_the_views_rollup_for_the_seat(skills, clock):
    app, stub = skills
    start = clock.now()
    a = await create(stub, "a", ["a"])  # ages at the end: 40, 30, 20, 10 days
    clock.advance(days=10)
    b = await create(stub, "b", ["b"])
    clock.advance(days=10)
    await create(stub, "c", ["c"])
    clock.advance(days=10)
    d = await create(stub, "d", ["d"])
    for _ in range(3):
        await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_id=a.id))
    clock.advance(days=5)
    await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_id=b.id))
    last_use = clock.now()
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=d.id))
    clock.set(start + timedelta(days=40))
    resp = await stub.GetLearningHealth(pb.GetLearningHealthRequest(company="acme", seat="ana"))
    h = resp.health
    assert (h.total_skills, h.skills_used_at_least_once, h.total_skill_uses) == (4, 2, 4)
    assert h.avg_uses_per_skill == pytest.approx(1.0)
    assert h.avg_skill_age_days == pytest.approx(25.0)
    assert dt(h.most_recent_skill_use_time) == last_use
    assert (h.active_skills, h.stale_skills, h.archived_skills) == (3, 0, 1)
    assert resp.berlot_attwell_threshold == pytest.approx(0.1) and resp.below_berlot_attwell_threshold is False
    # The same row is what an operator reads from the view directly.
    row = await app.infra.pool.fetchrow("SELECT * FROM learning_health WHERE company = 'acme' AND seat = 'ana'")
    assert row["total_skills"] == 4 and row["avg_uses_per_skill"] == pytest.approx(1.0)


async def test_a_library_nobody_uses_is_below_the_berlot_attwell_threshold(skills, clock):
    _, stub = skills
    made = [await create(stub, f"s{i}", [f"t{i}"], seat="cal") for i in range(20)]
    await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="cal", skill_id=made[0].id))
    clock.advance(days=60)
    resp = await stub.GetLearningHealth(pb.GetLearningHealthRequest(company="acme", seat="cal"))
    assert resp.health.avg_uses_per_skill == pytest.approx(0.05)
    assert resp.below_berlot_attwell_threshold is True
    assert resp.health.avg_skill_age_days == pytest.approx(60.0)
    # A seat with no skills claims nothing: zeros, and not "below".
    empty = await stub.GetLearningHealth(pb.GetLearningHealthRequest(company="acme", seat="dan"))
    assert empty.health.total_skills == 0 and empty.below_berlot_attwell_threshold is False
    assert not empty.health.HasField("most_recent_skill_use_time")


# ----------------------------------------------------------------------------------- marked used


async def test_mark_used_counts_each_offered_live_skill_once_per_request(skills, clock):
    _, stub = skills
    a = await create(stub, "alpha", tools=["a1", "a2"], clock=clock)
    b = await create(stub, "beta", tools=["b1", "b2"], clock=clock)
    gone = await create(stub, "gamma", tools=["c1", "c2"], clock=clock)
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=gone.id))
    clock.advance(days=1)
    req = pb.MarkSkillsUsedRequest(
        company="acme", seat="ana", skill_ids=[a.id, b.id, gone.id], turn_id="run-1", request_id="run-1:skill_use"
    )
    first = await stub.MarkSkillsUsed(req)
    assert (first.marked_count, first.already_applied) == (2, False)  # the archived one is not resurrected
    again = await stub.MarkSkillsUsed(req)  # a redone reflection
    assert (again.marked_count, again.already_applied) == (0, True)
    got = {
        s.name: s
        for s in (await stub.ListSkills(pb.ListSkillsRequest(company="acme", seat="ana", include_archived=True))).skills
    }
    assert (got["alpha"].use_count, got["beta"].use_count, got["gamma"].use_count) == (1, 1, 0)
    assert dt(got["alpha"].last_used_time) == clock.now()
    assert got["gamma"].state == pb.SKILL_STATE_ARCHIVED


async def test_mark_used_revives_a_stale_skill(skills, clock):
    app, stub = skills
    s = await create(stub, "alpha", clock=clock)
    clock.advance(days=31)
    await passes.curate(app.components["skills"].service)
    assert (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=s.id))).skill.state == (
        pb.SKILL_STATE_STALE
    )
    resp = await stub.MarkSkillsUsed(pb.MarkSkillsUsedRequest(company="acme", seat="ana", skill_ids=[s.id]))
    assert list(resp.revived_skill_names) == ["alpha"]
    assert (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=s.id))).skill.state == (
        pb.SKILL_STATE_ACTIVE
    )


async def test_concurrent_retries_of_one_proposal_are_told_it_is_already_proposed(skills, dsn):
    """Two retries of one ProposeSkill (the same request id) both pass the look-up before the seat's
    lock (held here by the test until both wait on it). The second under the lock finds the first's
    proposal by its request id: ALREADY_PROPOSED, the same proposal — it used to be matched against
    its own proposal and told DUPLICATE_PROPOSAL."""
    import asyncpg

    from services.skills.store import _LOCK_NAMESPACE

    _, stub = skills
    request = pb.ProposeSkillRequest(
        company="acme",
        seat="ana",
        name="open-pr",
        summary="Open a pull request for a ticket.",
        body="# open-pr\n\n1. Read the ticket.\n2. Open the PR.\n",
        tool_sequence=["jira_get_issue", "github_create_pr"],
        origin=pb.PROPOSAL_ORIGIN_DISTILL_SKILL,
        request_id="retry-7",
    )
    blocker = await asyncpg.connect(dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT pg_advisory_xact_lock($1, hashtext('acme/ana'))", _LOCK_NAMESPACE)

        async def propose() -> pb.ProposeSkillResponse:
            return await stub.ProposeSkill(request)

        calls = [asyncio.create_task(propose()) for _ in range(2)]
        async with asyncio.timeout(30):  # both past the first look-up, waiting for the seat
            while (
                await blocker.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted") < 2
            ):
                await asyncio.sleep(0.02)
        await tx.commit()
        answers = await asyncio.gather(*calls)
    finally:
        await blocker.close()
    dispositions = sorted(a.disposition for a in answers)
    assert dispositions == sorted([pb.PROPOSAL_DISPOSITION_CREATED, pb.PROPOSAL_DISPOSITION_ALREADY_PROPOSED])
    assert answers[0].proposal.id == answers[1].proposal.id
    assert not any(a.HasField("match") for a in answers)
