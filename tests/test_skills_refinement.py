"""Refinement: whole-body replacement (manual), observation bullets under one heading at the end
(auto), the body cap (refused vs skipped), versions bounded by max_versions_kept, forward rollback,
and the refinement switches."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.skills import create_skill

BODY = "---\nname: open-pr\n---\n# Open a PR\n\n## Steps\n\n1. Branch.\n2. Push.\n3. Open the PR.\n"
HEADING = "## What practice added"
TOOLS = ["git_branch", "git_push", "github_create_pr"]


async def open_skills(make_settings, dsn, clock, **refinement):  # type: ignore[no-untyped-def]
    return open_app(
        make_settings(learning={"skill_refinement": refinement}) if refinement else make_settings(),
        dsn,
        names=["skills"],
        clock=clock,
    )


@pytest.fixture
async def skills(make_settings, dsn, clock):
    async with await open_skills(make_settings, dsn, clock) as app:
        yield app, pb_grpc.SkillServiceStub(app.channel)


async def create(stub, name="open-pr", body=BODY, seat="ana"):  # type: ignore[no-untyped-def]
    return await create_skill(
        stub, name, TOOLS, seat=seat, summary="Open a pull request", body=body, source_turn_ids=["run-1"]
    )


def refine(stub, body, *, name="open-pr", reason="", seat="ana", **kw):  # type: ignore[no-untyped-def]
    return stub.RefineSkill(
        pb.RefineSkillRequest(company="acme", seat=seat, skill_name=name, body=body, reason=reason, **kw)
    )


def observe(stub, text, kind=pb.OBSERVATION_KIND_OBSERVED, *, name="open-pr", **kw):  # type: ignore[no-untyped-def]
    return stub.AppendSkillObservation(
        pb.AppendSkillObservationRequest(company="acme", seat="ana", skill_name=name, kind=kind, observation=text, **kw)
    )


async def versions(stub, name="open-pr"):  # type: ignore[no-untyped-def]
    resp = await stub.ListSkillVersions(pb.ListSkillVersionsRequest(company="acme", seat="ana", skill_name=name))
    return resp


async def refused(call):  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return error_info(exc.value)


# ------------------------------------------------------------------------------------- manual path


async def test_refine_replaces_the_whole_body_and_archives_the_prior_one(skills, clock):
    app, stub = skills
    await create(stub)
    clock.advance(hours=1)
    new = "# Open a PR\n\n1. Branch from main, not from develop.\n2. Push.\n3. Open the PR.\n"
    skill = (await refine(stub, new, reason="develop is gone", turn_id="run-8")).skill
    assert skill.body == new and skill.version == 2
    listed = await versions(stub)
    assert listed.total_size == 2
    assert [(v.version, v.current, v.change) for v in listed.versions] == [
        (2, True, pb.SKILL_CHANGE_REFINED),
        (1, False, pb.SKILL_CHANGE_CREATED),
    ]
    assert listed.versions[1].body == BODY and listed.versions[0].reason == "develop is gone"
    assert listed.versions[1].HasField("supersede_time") and not listed.versions[0].HasField("supersede_time")
    [event] = await read_events(app.infra.pool, "skill_refined")
    assert event["turn_id"] == "run-8" and event["payload"]["path"] == "manual"
    assert event["payload"]["reason"] == "develop is gone" and event["payload"]["version"] == 2


async def test_refine_past_the_body_cap_is_refused_naming_the_field(skills):
    app, stub = skills
    await create(stub)
    ok = (await refine(stub, "z" * 20_000)).skill
    assert ok.body_chars == 20_000 and ok.version == 2
    code, info, bad = await refused(refine(stub, "z" * 20_001))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "SKILL_BODY_TOO_LONG"
    assert bad.field_violations[0].field == "body" and info.metadata["limit"] == "20000"
    got = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_name="open-pr"))).skill
    assert got.version == 2 and got.body_chars == 20_000  # untouched, never truncated
    assert await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skill_versions") == 1


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"body": ""}, "body", "FIELD_REQUIRED"),
        ({"body": "x", "reason": "r" * 1001}, "reason", "FIELD_TOO_LONG"),
        ({"body": "x", "name": ""}, "skill_id", "ONE_OF_REQUIRED"),
        ({"body": "x", "request_id": "k" * 401}, "request_id", "FIELD_TOO_LONG"),
    ],
)
async def test_refine_refuses_a_bad_request_naming_the_field(skills, kwargs, field, reason):
    _, stub = skills
    await create(stub)
    body = kwargs.pop("body")
    code, info, bad = await refused(refine(stub, body, **kwargs))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == reason
    assert bad.field_violations[0].field == field


async def test_a_seat_refines_only_its_own_skills(skills):
    _, stub = skills
    await create(stub, seat="bob")
    code, info, _ = await refused(refine(stub, "mine now", seat="ana"))
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "SKILL_NOT_FOUND"
    got = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="bob", skill_name="open-pr"))).skill
    assert got.body == BODY and got.version == 1


async def test_an_archived_skill_is_not_refined(skills):
    _, stub = skills
    await create(stub)
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_name="open-pr"))
    code, info, _ = await refused(refine(stub, "new"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "SKILL_ARCHIVED"


async def test_a_retried_refinement_with_its_request_id_changes_nothing(skills):
    _, stub = skills
    await create(stub)
    first = (await refine(stub, "v2 body", request_id="req-1")).skill
    again = (await refine(stub, "v2 body", request_id="req-1")).skill
    assert first.version == again.version == 2
    assert (await versions(stub)).total_size == 2


# --------------------------------------------------------------------------------------- auto path


async def test_bullets_collect_under_one_heading_at_the_end(skills, clock):
    app, stub = skills
    await create(stub)
    first = await observe(stub, "CI needs the\n`ready` label   before review.", turn_id="run-2", request_id="r2")
    assert first.skipped is False and first.skill.version == 2
    assert (
        first.skill.body
        == BODY.rstrip() + f"\n\n{HEADING}\n\n- Observed in practice: CI needs the `ready` label before review.\n"
    )
    second = await observe(
        stub, "Counter-example: pushing to a fork lost the branch protection.", pb.OBSERVATION_KIND_COUNTER_EXAMPLE
    )
    body = second.skill.body
    assert body.count(HEADING) == 1 and body.endswith(
        f"{HEADING}\n\n"
        "- Observed in practice: CI needs the `ready` label before review.\n"
        "- Counter-example: pushing to a fork lost the branch protection.\n"
    )
    assert body.startswith(BODY.rstrip())  # the procedure first, what practice added second
    assert second.skill.version == 3
    listed = await versions(stub)
    assert [v.change for v in listed.versions] == [
        pb.SKILL_CHANGE_OBSERVATION_APPENDED,
        pb.SKILL_CHANGE_OBSERVATION_APPENDED,
        pb.SKILL_CHANGE_CREATED,
    ]
    assert listed.versions[0].reason == "- Counter-example: pushing to a fork lost the branch protection."
    events = await read_events(app.infra.pool, "skill_refined")
    assert [e["payload"]["path"] for e in events] == ["auto", "auto"]
    assert [e["payload"]["observation_kind"] for e in events] == ["observed", "counter_example"]


async def test_a_section_a_refinement_left_mid_body_is_moved_back_to_the_end(skills):
    _, stub = skills
    await create(stub)
    await observe(stub, "first lesson")
    body = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_name="open-pr"))).skill.body
    await refine(stub, body + "\n## Appendix\n\nLinks.\n")  # the model wrote a section after it
    got = (await observe(stub, "second lesson")).skill.body
    assert got.count(HEADING) == 1
    assert got.index("## Appendix") < got.index(HEADING)
    assert got.endswith(f"{HEADING}\n\n- Observed in practice: first lesson\n- Observed in practice: second lesson\n")


async def test_a_redelivered_observation_is_appended_once(skills):
    _, stub = skills
    await create(stub)
    for _ in range(3):
        resp = await observe(stub, "one lesson", request_id="run-2:refiner")
        assert resp.skipped is False and resp.skill.version == 2
    assert resp.skill.body.count("one lesson") == 1


async def test_a_bullet_past_the_body_cap_is_skipped_and_logged_not_refused(make_settings, dsn, clock):
    async with await open_skills(make_settings, dsn, clock, max_body_chars=len(BODY) + 80) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub)
        fits = await observe(stub, "short")  # heading + bullet: 51 characters
        assert fits.skipped is False and fits.skill.version == 2
        resp = await observe(stub, "a much longer lesson that will not fit under the cap at all", turn_id="run-3")
        assert resp.skipped is True and resp.skip_reason == pb.OBSERVATION_SKIP_REASON_BODY_CAP
        assert resp.skill.version == 2 and resp.skill.body == fits.skill.body
        [event] = await read_events(app.infra.pool, "skill_refinement_skipped")
        assert event["payload"]["reason"] == "body_cap" and event["turn_id"] == "run-3"
        assert event["payload"]["limit"] == len(BODY) + 80


async def test_an_observation_for_an_archived_skill_is_skipped(skills):
    _, stub = skills
    await create(stub)
    await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_name="open-pr"))
    resp = await observe(stub, "late lesson")
    assert resp.skipped is True and resp.skip_reason == pb.OBSERVATION_SKIP_REASON_ARCHIVED
    assert resp.skill.state == pb.SKILL_STATE_ARCHIVED and resp.skill.version == 1


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"kind": pb.OBSERVATION_KIND_UNSPECIFIED}, "kind", "FIELD_REQUIRED"),
        ({"kind": 7}, "kind", "FIELD_INVALID"),
        ({"text": "  "}, "observation", "FIELD_REQUIRED"),
        ({"text": "o" * 1001}, "observation", "FIELD_TOO_LONG"),
    ],
)
async def test_an_observation_request_is_checked(skills, kwargs, field, reason):
    _, stub = skills
    await create(stub)
    code, info, bad = await refused(
        observe(stub, kwargs.get("text", "lesson"), kwargs.get("kind", pb.OBSERVATION_KIND_OBSERVED))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == reason
    assert bad.field_violations[0].field == field


# ---------------------------------------------------------------------------------------- switches


async def test_refinement_disabled_refuses_both_paths_and_leaves_use_alone(make_settings, dsn, clock):
    async with await open_skills(make_settings, dsn, clock, enabled=False) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub)
        for call in (refine(stub, "new body"), observe(stub, "lesson")):
            code, info, _ = await refused(call)
            assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "REFINEMENT_DISABLED"
            assert info.metadata["knob"].startswith("learning.skill_refinement.")
        used = await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr"))
        assert used.skill.body == BODY and used.skill.version == 1


async def test_both_auto_flags_off_is_the_auto_path_off(make_settings, dsn, clock):
    async with await open_skills(
        make_settings, dsn, clock, auto_refine_on_success=False, auto_refine_on_failure=False
    ) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub)
        code, info, _ = await refused(observe(stub, "lesson"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "REFINEMENT_DISABLED"
        # The manual path answers to `enabled` alone.
        assert (await refine(stub, "fixed by hand")).skill.version == 2


async def test_one_auto_flag_off_refuses_that_kind_only(make_settings, dsn, clock):
    async with await open_skills(make_settings, dsn, clock, auto_refine_on_success=False) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub)
        code, info, _ = await refused(observe(stub, "lesson", pb.OBSERVATION_KIND_OBSERVED))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "OBSERVATION_KIND_DISABLED"
        resp = await observe(stub, "it broke", pb.OBSERVATION_KIND_COUNTER_EXAMPLE)
        assert resp.skipped is False and "- Counter-example: it broke" in resp.skill.body


# --------------------------------------------------------------------------------- versions, rollback


async def test_rollback_is_a_forward_step_so_rewinding_and_unrewinding_lose_nothing(skills):
    app, stub = skills
    await create(stub, body="A\n")
    await refine(stub, "B\n", reason="try B")
    rewound = (
        await stub.RollbackSkill(pb.RollbackSkillRequest(company="acme", seat="ana", skill_name="open-pr", version=1))
    ).skill
    assert rewound.body == "A\n" and rewound.version == 3
    unrewound = (
        await stub.RollbackSkill(pb.RollbackSkillRequest(company="acme", seat="ana", skill_name="open-pr", version=2))
    ).skill
    assert unrewound.body == "B\n" and unrewound.version == 4
    listed = await versions(stub)
    assert [(v.version, v.body, v.change, v.restored_from_version) for v in listed.versions] == [
        (4, "B\n", pb.SKILL_CHANGE_ROLLED_BACK, 2),
        (3, "A\n", pb.SKILL_CHANGE_ROLLED_BACK, 1),
        (2, "B\n", pb.SKILL_CHANGE_REFINED, 0),
        (1, "A\n", pb.SKILL_CHANGE_CREATED, 0),
    ]
    assert [e["payload"]["path"] for e in await read_events(app.infra.pool, "skill_refined")] == [
        "manual",
        "rollback",
        "rollback",
    ]


async def test_a_retried_rollback_with_its_request_id_writes_nothing_new(skills):
    app, stub = skills
    await create(stub, body="A\n")
    await refine(stub, "B\n", reason="try B")

    def rollback(version, request_id):  # type: ignore[no-untyped-def]
        return stub.RollbackSkill(
            pb.RollbackSkillRequest(
                company="acme", seat="ana", skill_name="open-pr", version=version, request_id=request_id
            )
        )

    first = (await rollback(1, "rb-1")).skill
    again = (await rollback(1, "rb-1")).skill  # the retry of a call whose answer was lost
    assert first.body == again.body == "A\n" and first.version == again.version == 3
    assert (await versions(stub)).total_size == 3
    paths = [e["payload"]["path"] for e in await read_events(app.infra.pool, "skill_refined")]
    assert paths == ["manual", "rollback"]
    # Another key is another rollback.
    assert (await rollback(2, "rb-2")).skill.version == 4
    code, info, _ = await refused(rollback(1, "x" * 401))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_TOO_LONG"


async def test_history_is_bounded_by_max_versions_kept(make_settings, dsn, clock):
    async with await open_skills(make_settings, dsn, clock, max_versions_kept=3) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub, body="v1\n")
        for i in range(2, 8):
            await refine(stub, f"v{i}\n")
        listed = await versions(stub)
        assert [v.version for v in listed.versions] == [7, 6, 5, 4]  # the live one and three archived
        assert listed.total_size == 4
        assert await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skill_versions") == 3
        code, info, _ = await refused(
            stub.RollbackSkill(pb.RollbackSkillRequest(company="acme", seat="ana", skill_name="open-pr", version=2))
        )
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "SKILL_VERSION_NOT_FOUND"
        assert info.metadata["version"] == "2" and info.metadata["current_version"] == "7"
        rolled = await stub.RollbackSkill(
            pb.RollbackSkillRequest(company="acme", seat="ana", skill_name="open-pr", version=4)
        )
        assert rolled.skill.body == "v4\n" and rolled.skill.version == 8
        assert [v.version for v in (await versions(stub)).versions] == [8, 7, 6, 5]


async def test_rollback_refusals(skills):
    _, stub = skills
    await create(stub)
    await refine(stub, "B\n")
    for version, code, reason in (
        (2, grpc.StatusCode.FAILED_PRECONDITION, "SKILL_VERSION_CURRENT"),
        (0, grpc.StatusCode.INVALID_ARGUMENT, "FIELD_REQUIRED"),
        (-1, grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID"),
        (9, grpc.StatusCode.NOT_FOUND, "SKILL_VERSION_NOT_FOUND"),
    ):
        got_code, info, bad = await refused(
            stub.RollbackSkill(
                pb.RollbackSkillRequest(company="acme", seat="ana", skill_name="open-pr", version=version)
            )
        )
        assert (got_code, info.reason) == (code, reason)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            assert bad.field_violations[0].field == "version"


async def test_versions_page_newest_first(skills):
    _, stub = skills
    await create(stub, body="v1\n")
    for i in range(2, 6):
        await refine(stub, f"v{i}\n")
    seen, token = [], ""
    while True:
        page = await stub.ListSkillVersions(
            pb.ListSkillVersionsRequest(company="acme", seat="ana", skill_name="open-pr", page_size=2, page_token=token)
        )
        assert page.total_size == 5
        seen += [v.version for v in page.versions]
        token = page.next_page_token
        if not token:
            break
    assert seen == [5, 4, 3, 2, 1]
    code, info, _ = await refused(
        stub.ListSkillVersions(pb.ListSkillVersionsRequest(company="acme", seat="ana", skill_name="x"))
    )
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "SKILL_NOT_FOUND"
