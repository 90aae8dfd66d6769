"""The skill curator: active → stale → archived on disuse, the widened archive window, pinned
skills exempt, archived skills still readable, operator restores; set-based over many skills."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import grpc
import pytest

from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from libs.common.passrunner import run_pass
from services.skills import passes
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.skills import create_skill


@pytest.fixture
async def skills(make_settings, dsn, clock):
    async with open_app(make_settings(), dsn, names=["skills"], clock=clock) as app:
        yield app, pb_grpc.SkillServiceStub(app.channel)


async def create(stub, name, *, seat="ana"):  # type: ignore[no-untyped-def]
    return await create_skill(stub, name, [f"{name}_tool"], seat=seat)


async def states(app) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dict(await app.infra.pool.fetch("SELECT name, state FROM synthesized_skills ORDER BY name"))


async def curate(app):  # type: ignore[no-untyped-def]
    return await passes.curate(app.components["skills"].service)


async def test_unused_for_thirty_days_goes_stale_and_ninety_archived(skills, clock):
    app, stub = skills
    await create(stub, "old")
    clock.advance(days=29, hours=23)
    assert (await curate(app)).staled == 0
    clock.advance(hours=1)  # exactly thirty days unused
    report = await curate(app)
    assert (report.staled, report.archived) == (1, 0)
    assert await states(app) == {"old": "stale"}
    [staled] = await read_events(app.infra.pool, "skill_staled")
    assert staled["seat"] == "ana" and staled["payload"]["name"] == "old" and staled["payload"]["days_unused"] == 30
    clock.advance(days=59, hours=23)
    assert (await curate(app)).archived == 0
    clock.advance(hours=1)  # ninety days unused
    report = await curate(app)
    assert (report.staled, report.archived) == (0, 1)
    assert await states(app) == {"old": "archived"}
    [archived] = await read_events(app.infra.pool, "skill_archived")
    assert archived["payload"]["cause"] == "curator" and archived["payload"]["days_unused"] == 90
    # Archived is not deleted: readable, hidden from the menu, refused to use.
    got = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_name="old"))).skill
    assert got.state == pb.SKILL_STATE_ARCHIVED and got.body == "# old\n"
    assert (await stub.ListSkills(pb.ListSkillsRequest(company="acme", seat="ana"))).total_size == 0
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="old"))
    assert error_info(exc.value)[1].reason == "SKILL_ARCHIVED"


async def test_a_use_resets_the_clock(skills, clock):
    app, stub = skills
    await create(stub, "used")
    await create(stub, "idle")
    clock.advance(days=25)
    await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="used"))
    clock.advance(days=10)
    await curate(app)
    assert await states(app) == {"idle": "stale", "used": "active"}


async def test_a_pass_moves_a_skill_one_step_so_stale_is_always_seen(skills, clock):
    """A curator that did not run for 100 days stales the skill first; it archives it next pass."""
    app, stub = skills
    await create(stub, "forgotten")
    clock.advance(days=100)
    assert (await curate(app)).staled == 1
    assert await states(app) == {"forgotten": "stale"}
    assert (await curate(app)).archived == 1
    assert await states(app) == {"forgotten": "archived"}


async def test_the_pass_is_idempotent(skills, clock):
    app, stub = skills
    await create(stub, "a")
    clock.advance(days=31)
    assert (await curate(app)).staled == 1
    again = await curate(app)
    assert (again.staled, again.archived) == (0, 0)
    assert len(await read_events(app.infra.pool, "skill_staled")) == 1


async def test_an_archive_window_inside_the_stale_window_is_widened_to_it(make_settings, dsn, clock):
    # Under an earlier, shorter stale window the skill went stale after five days.
    async with open_app(
        make_settings(learning={"skill_curator": {"stale_after_days": 5}}), dsn, names=["skills"], clock=clock
    ) as app:
        stub = pb_grpc.SkillServiceStub(app.channel)
        await create(stub, "early")
        await create(stub, "fresh-ish")
        clock.advance(days=6)
        await curate(app)
        await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="fresh-ish"))
        assert await states(app) == {"early": "stale", "fresh-ish": "active"}
    # Now the archive window (10) sits inside the stale window (30): taken literally it would archive
    # a skill unused for 12 days, which the same policy calls fresh.
    misconfigured = make_settings(learning={"skill_curator": {"stale_after_days": 30, "archive_after_days": 10}})
    async with open_app(misconfigured, dsn, names=["skills"], clock=clock) as app:
        clock.advance(days=6)  # "early" unused 12 days, "fresh-ish" 6
        report = await curate(app)
        assert report.widened is True and report.archive_after_days == 30
        assert (report.staled, report.archived) == (0, 0)
        assert await states(app) == {"early": "stale", "fresh-ish": "active"}
        clock.advance(days=18)  # "early" unused 30 days: now the widened window archives it
        report = await curate(app)
        assert report.archived == 1
        assert await states(app) == {"early": "archived", "fresh-ish": "active"}
        event = (await read_events(app.infra.pool, "skill_curator_completed"))[-1]
        assert event["payload"]["archive_after_days"] == 30 and event["payload"]["widened"] is True


async def test_pinned_skills_are_exempt_from_every_automatic_transition(skills, clock):
    app, stub = skills
    await create(stub, "pinned-active")
    await create(stub, "pinned-stale")
    await create(stub, "loose")
    await stub.PinSkill(pb.PinSkillRequest(company="acme", seat="ana", skill_name="pinned-active"))
    clock.advance(days=31)
    await curate(app)
    assert await states(app) == {"loose": "stale", "pinned-active": "active", "pinned-stale": "stale"}
    pinned = (await stub.PinSkill(pb.PinSkillRequest(company="acme", seat="ana", skill_name="pinned-stale"))).skill
    assert pinned.pinned is True and pinned.state == pb.SKILL_STATE_STALE
    clock.advance(days=200)
    await curate(app)
    await curate(app)
    assert await states(app) == {"loose": "archived", "pinned-active": "active", "pinned-stale": "stale"}
    # A use of a pinned stale skill is recorded, but its state is the operator's (no revival).
    used = await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="pinned-stale"))
    assert used.skill.use_count == 1 and used.skill.state == pb.SKILL_STATE_STALE and used.revived is False
    # Unpinned, the clock applies again.
    await stub.UnpinSkill(pb.UnpinSkillRequest(company="acme", seat="ana", skill_name="pinned-active"))
    await curate(app)
    assert (await states(app))["pinned-active"] == "stale"
    events = [e["kind"] for e in await read_events(app.infra.pool) if e["kind"] in {"skill_pinned", "skill_unpinned"}]
    assert events == ["skill_pinned", "skill_pinned", "skill_unpinned"]


async def test_restore_brings_an_archived_skill_back_with_a_fresh_clock(skills, clock):
    app, stub = skills
    skill = await create(stub, "old")
    clock.advance(days=95)
    await curate(app)
    await curate(app)
    assert await states(app) == {"old": "archived"}
    restored = (await stub.RestoreSkill(pb.RestoreSkillRequest(company="acme", seat="ana", skill_id=skill.id))).skill
    assert restored.state == pb.SKILL_STATE_ACTIVE and restored.days_unused == 0
    await curate(app)  # the next tick does not age it out again at once
    assert await states(app) == {"old": "active"}
    assert (await stub.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", skill_name="old"))).skill.use_count == 1
    [event] = await read_events(app.infra.pool, "skill_restored")
    assert event["payload"]["from_state"] == "archived"


async def test_archive_is_an_operator_edit_and_idempotent(skills):
    app, stub = skills
    await create(stub, "a")
    for _ in range(2):
        got = (await stub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_name="a"))).skill
        assert got.state == pb.SKILL_STATE_ARCHIVED
    [event] = await read_events(app.infra.pool, "skill_archived")
    assert event["payload"]["cause"] == "operator"


async def test_operator_edits_of_a_missing_skill_are_not_found(skills):
    _, stub = skills
    for call, req in (
        (stub.PinSkill, pb.PinSkillRequest),
        (stub.UnpinSkill, pb.UnpinSkillRequest),
        (stub.ArchiveSkill, pb.ArchiveSkillRequest),
        (stub.RestoreSkill, pb.RestoreSkillRequest),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call(req(company="acme", seat="ana", skill_name="ghost"))
        code, info, _ = error_info(exc.value)
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "SKILL_NOT_FOUND"


async def test_the_curator_moves_thousands_of_skills_set_based_with_one_event_each(skills, clock):
    app, _ = skills
    now = clock.now()
    # 3,000 skills over 300 seats, bulk-inserted: a third fresh, a third 40 days idle, a third 100
    # days idle and already stale; every tenth of the idle ones pinned.
    await app.infra.pool.execute(
        """
        INSERT INTO synthesized_skills (id, company, seat, name, summary, body, tool_sequence, trigger, cluster_size,
                                        state, pinned, unused_since, state_change_time, create_time, update_time,
                                        version_time)
        SELECT gen_random_uuid(), 'acme', 'seat-' || (i % 300), 'skill-' || i, 's', 'b', ARRAY['t' || i], 'single', 1,
               CASE WHEN i % 3 = 2 THEN 'stale' ELSE 'active' END,
               (i % 3 <> 0 AND i % 10 = 0),
               $1::timestamptz - make_interval(days => (ARRAY[0, 40, 100])[i % 3 + 1]), $1, $1 - interval '200 days',
               $1, $1
        FROM generate_series(0, 2999) AS i""",
        now,
    )
    pinned = await app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skills WHERE pinned")
    report = await run_pass(
        app.passes()["skill-curator"], app.infra.leases, "test-holder", app.infra.settings.leases.ttl_seconds
    )
    assert report[0] is True
    counts = dict(await app.infra.pool.fetch("SELECT state, count(*) FROM synthesized_skills GROUP BY state"))
    idle_active, idle_stale = 1000, 1000
    pinned_active = await app.infra.pool.fetchval(
        "SELECT count(*) FROM synthesized_skills WHERE pinned AND state = 'active'"
    )
    assert report[1].staled == idle_active - pinned_active
    assert report[1].archived == idle_stale - (pinned - pinned_active)
    assert counts["archived"] == report[1].archived
    assert counts["active"] == 1000 + pinned_active
    assert len(await read_events(app.infra.pool, "skill_staled")) == report[1].staled
    assert len(await read_events(app.infra.pool, "skill_archived")) == report[1].archived
    sample = (await read_events(app.infra.pool, "skill_archived"))[0]
    assert sample["payload"]["days_unused"] == 100 and uuid.UUID(sample["payload"]["skill_id"])
    assert sample["company"] == "acme" and sample["seat"].startswith("seat-")


async def test_days_unused_is_the_ageing_marker_in_every_read(skills, clock):
    app, stub = skills
    skill = await create(stub, "a")
    clock.advance(days=31, hours=5)
    await curate(app)
    got = (await stub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=skill.id))).skill
    assert got.state == pb.SKILL_STATE_STALE and got.days_unused == 31
    assert got.unused_since_time.ToDatetime().replace(tzinfo=UTC) == clock.now() - timedelta(days=31, hours=5)
