"""Clustered synthesis over the real episodes service: the largest qualifying cluster first, one
draft per seat per pass, a cluster the seat already learned skipped (not a stop), the
representative run stored, source turns stamped, a draft with a gap dropped; a scripted model, and
the offline rule when there is none."""

from __future__ import annotations

import json

import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as epb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as epb_grpc
from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from tests.support.app import open_app
from tests.support.scripted_openai import Reply, openai_provider
from tests.support.skills import create_skill
from tests.support.turns import raw_episode

X = {  # five settled turns of one shape; x4 is the member most like all the others
    "x1": ["a", "b", "c", "d", "e", "i"],
    "x2": ["a", "b", "c", "d", "e", "f"],
    "x3": ["a", "b", "c", "d", "e", "g"],
    "x4": ["c", "a", "b", "e", "d"],
    "x5": ["a", "b", "c", "d", "e", "h"],
}
Y = ["p", "q", "r", "s", "t"]
Z = ["jira_get", "jira_comment", "slack_post", "github_pr", "github_merge"]
REPRESENTATIVE_MARK = "The representative run (a run that actually happened):\n"


async def record(  # type: ignore[no-untyped-def]
    estub,
    clock,
    turn_id,
    tools,
    *,
    seat="ana",
    outcome=epb.TURN_OUTCOME_DONE,
    calls=None,
    final_round=None,
    role="",
    ask=None,
):
    """``tools``: the turn's calls (``calls`` overrides them); ``final_round``: its last round, by
    default the last call — the two lists an engine reports are not the same list."""
    clock.advance(minutes=1)
    end = clock.now()
    label, what = "Message from Ana: Slack message", f"handled {turn_id}"
    ask = f"please handle {turn_id}" if ask is None else ask
    last_round = tools[-1:] if final_round is None else final_round
    request = raw_episode(
        seat, turn_id, end, label, ask, what, last_round, outcome, minutes=0.5,
        role=role, tools_called=calls if calls is not None else tools, subjects=[f"asker-of-{turn_id}"],
    )  # fmt: skip
    await estub.RecordEpisode(request)


def scripted_settings(make_settings, scripted_openai, *, extra=None, **synthesis):  # type: ignore[no-untyped-def]
    extra = dict(extra or {})
    learning = {**extra.pop("learning", {}), **({"skill_synthesis": synthesis} if synthesis else {})}
    return make_settings(
        providers={
            "embeddings": {"kind": "none"},
            "llm": {
                "scripted": openai_provider(scripted_openai, "scripted-chat"),
                "offline": {"kind": "offline"},
            },
            "auxiliary_chain": ["scripted"],
        },
        learning=learning,
        **extra,
    )


def representative_of(body: dict) -> list[str]:
    user = body["messages"][1]["content"]
    return user.split(REPRESENTATIVE_MARK, 1)[1].split("\n", 1)[0].split(" → ")


def draft_from_prompt(body: dict) -> str:
    tools = representative_of(body)
    name = f"routine-{tools[0]}-{len(tools)}"
    return json.dumps({"name": name, "summary": f"when {tools[0]} work comes in", "body": f"# {name}\n"})


@pytest.fixture
async def app(make_settings, dsn, clock, scripted_openai):
    scripted_openai.chat_handler = draft_from_prompt
    async with open_app(
        scripted_settings(make_settings, scripted_openai), dsn, names=["episodes", "skills"], clock=clock
    ) as app:
        yield app


def stubs(app):  # type: ignore[no-untyped-def]
    return epb_grpc.EpisodeServiceStub(app.channel), pb_grpc.SkillServiceStub(app.channel)


async def synthesize(app):  # type: ignore[no-untyped-def]
    return await app.passes()["skill-synthesis"].run()


async def consolidated(estub, turn_id, seat="ana") -> str:  # type: ignore[no-untyped-def]
    got = await estub.GetEpisode(epb.GetEpisodeRequest(company="acme", seat=seat, turn_id=turn_id))
    return got.episode.consolidated_into_skill_id


async def catalogue(sstub, seat="ana"):  # type: ignore[no-untyped-def]
    resp = await sstub.ListSkills(pb.ListSkillsRequest(company="acme", seat=seat, view=pb.SKILL_VIEW_FULL))
    return list(resp.skills)


async def create_unrelated_skill(sstub, name: str) -> None:  # type: ignore[no-untyped-def]
    """A live skill of ana's named ``name`` whose tool sequence no recorded turn shares."""
    await create_skill(sstub, name, ["unrelated"], summary="s", body="b", source_turn_ids=["r"])


async def test_the_largest_cluster_is_drafted_from_its_representative_run_and_its_turns_stamped(
    app, clock, scripted_openai
):
    estub, sstub = stubs(app)
    for turn_id, tools in X.items():
        await record(estub, clock, turn_id, tools)
    for i in range(3):
        await record(estub, clock, f"y{i}", Y)
    # Not evidence: mid-state rounds and turns below min_tool_calls, of Y's shape (they would
    # make Y the largest cluster if counted), and two one-off turns.
    for i in range(4):
        await record(estub, clock, f"y-iter{i}", Y, outcome=epb.TURN_OUTCOME_SELF_ITERATE)
        await record(estub, clock, f"y-short{i}", Y, calls=["p", "q", "r"])
    await record(estub, clock, "odd1", ["u", "v", "w", "x", "y"])
    await record(estub, clock, "odd2", ["k", "l", "m", "n", "o"], outcome=epb.TURN_OUTCOME_FAILED)

    report = await synthesize(app)
    assert (report.seats, report.drafted, report.dropped) == (1, 1, 0)
    [call] = scripted_openai.received("chat")
    assert representative_of(call) == X["x4"]
    assert "woken by: Message from Ana: Slack message" in call["messages"][1]["content"]
    [skill] = await catalogue(sstub)
    assert skill.trigger == pb.SKILL_TRIGGER_CLUSTERED and skill.cluster_size == 5
    # A run that actually happened, in its own order; not the union of the members' tools.
    assert list(skill.tool_sequence) == X["x4"]
    assert sorted(skill.source_turn_ids) == sorted(X)
    # Issue 17: the draft rests on the people its turns answered, and names its model and prompt.
    prov = (
        await sstub.GetSkillProvenance(pb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=skill.id))
    ).provenance
    assert sorted(s.handle for s in prov.subjects) == sorted(f"asker-of-{t}" for t in X)
    assert prov.model and prov.prompt_version and prov.writer == "skill_synthesis:clustered"
    for turn_id in X:
        assert await consolidated(estub, turn_id) == skill.id
    for turn_id in ("y0", "odd1"):
        assert await consolidated(estub, turn_id) == ""
    [event] = await read_events(app.infra.pool, "skill_synthesized")
    assert event["turn_id"] is None
    assert event["payload"]["trigger"] == "clustered" and event["payload"]["cluster_size"] == 5
    [spend] = await read_events(app.infra.pool, "auxiliary_spend")
    assert spend["payload"]["stage"] == "background" and spend["payload"]["purpose"] == "skill_synthesis_clustered"
    assert spend["seat"] == "ana"


async def test_turns_are_pooled_and_stored_by_every_tool_they_called_not_their_final_round(app, clock, scripted_openai):
    """The clustered pass uses the one definition of a turn's tool set (every call, the run the
    single-turn path stores too): three turns that called Z's tools, each ending in another final
    round, are one cluster, and the skill stores the representative's whole run."""
    estub, sstub = stubs(app)
    for i, last in enumerate([["github_merge"], ["slack_post"], ["jira_comment", "github_pr"]]):
        await record(estub, clock, f"z{i}", Z, final_round=last)
    report = await synthesize(app)
    assert report.drafted == 1
    [skill] = await catalogue(sstub)
    assert skill.cluster_size == 3 and list(skill.tool_sequence) == Z


async def test_one_draft_per_seat_per_pass_and_a_learned_cluster_is_skipped_not_a_stop(app, clock, scripted_openai):
    estub, sstub = stubs(app)
    for turn_id, tools in X.items():
        await record(estub, clock, turn_id, tools)
    for i in range(4):
        await record(estub, clock, f"y{i}", Y)
    for i in range(3):
        await record(estub, clock, f"z{i}", Z)
        await record(estub, clock, f"bob-z{i}", Z, seat="bob")
    # The seat already learned Y's procedure (inline, from another turn).
    await create_skill(sstub, "the-y-thing", list(reversed(Y)), summary="s", body="b", source_turn_ids=["earlier"])

    first = await synthesize(app)
    assert (first.seats, first.drafted) == (2, 2)  # one draft for each seat
    assert {s.cluster_size for s in await catalogue(sstub) if s.trigger == pb.SKILL_TRIGGER_CLUSTERED} == {5}
    assert [s.cluster_size for s in await catalogue(sstub, "bob")] == [3]
    assert len(scripted_openai.received("chat")) == 2

    second = await synthesize(app)
    # X is learned (its turns are stamped); Y (4) duplicates "the-y-thing" and is skipped; Z (3) next.
    assert (second.drafted, second.skipped_duplicate) == (1, 1)
    clustered = {tuple(s.tool_sequence) for s in await catalogue(sstub) if s.trigger == pb.SKILL_TRIGGER_CLUSTERED}
    assert clustered == {tuple(X["x4"]), tuple(Z)}
    assert len(scripted_openai.received("chat")) == 3
    for i in range(4):
        assert await consolidated(estub, f"y{i}") == ""

    third = await synthesize(app)
    assert (third.drafted, third.skipped_duplicate) == (0, 1)
    assert len(scripted_openai.received("chat")) == 3  # nothing left to draft: no call


REFUSE_STAMPS = """
CREATE FUNCTION refuse_stamp() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'stamp refused for the test'; END $$;
CREATE TRIGGER refuse_stamp BEFORE UPDATE OF consolidated_into_skill_id ON episodes
  FOR EACH ROW EXECUTE FUNCTION refuse_stamp();
"""


@pytest.mark.parametrize("cap", [50, 1], ids=["room-left", "draft-filled-the-catalogue"])
async def test_a_stamp_that_failed_is_made_by_the_next_pass_without_drafting_again(
    make_settings, dsn, clock, scripted_openai, cap
):
    """The pass drafts from X, and stamping X's turns fails (the episodes store refuses the write):
    the skill stands, unstamped. The next pass stamps the turns the skill was drafted from — when
    its cluster is the skill's duplicate, and when that skill took the seat's last slot too — and
    drafts nothing. Turns of the same shape the skill was not drafted from stay unstamped."""
    scripted_openai.chat_handler = draft_from_prompt
    settings = scripted_settings(make_settings, scripted_openai, max_skills_per_agent=cap)
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        estub, sstub = stubs(app)
        for turn_id, tools in X.items():
            await record(estub, clock, turn_id, tools)
        await app.infra.pool.execute(REFUSE_STAMPS)
        first = await synthesize(app)
        assert first.drafted == 1 and [k for k in first.failures if k.startswith("consolidate:")]
        [skill] = await catalogue(sstub)
        assert await consolidated(estub, "x1") == ""
        await app.infra.pool.execute("DROP TRIGGER refuse_stamp ON episodes")

        await record(estub, clock, "x-later", X["x4"])  # the same shape, after the draft
        second = await synthesize(app)
        for turn_id in X:
            assert await consolidated(estub, turn_id) == skill.id
        assert (second.drafted, second.restamped, second.failures) == (0, 5, {})
        assert await consolidated(estub, "x-later") == ""
        assert len(scripted_openai.received("chat")) == 1 and len(await catalogue(sstub)) == 1
        [_, done] = await read_events(app.infra.pool, "skill_synthesis_completed")
        assert done["payload"]["restamped"] == 5


async def test_a_draft_without_a_name_summary_or_body_is_dropped(app, clock, scripted_openai):
    estub, sstub = stubs(app)
    for turn_id, tools in X.items():
        await record(estub, clock, turn_id, tools)
    for i in range(3):
        await record(estub, clock, f"z{i}", Z)
    answers = iter(
        [
            json.dumps({"name": "gap", "summary": "", "body": "# gap\n"}),
            json.dumps({"name": "routine", "summary": "when a-work comes in", "body": "# routine\n"}),
        ]
    )
    scripted_openai.chat_handler = lambda body: next(answers)
    report = await synthesize(app)
    assert (report.drafted, report.dropped) == (0, 1)
    # One draft per seat per pass: the dropped draft is not followed by one for the next cluster.
    assert len(scripted_openai.received("chat")) == 1
    assert await catalogue(sstub) == []
    assert await consolidated(estub, "x1") == ""
    assert await read_events(app.infra.pool, "skill_synthesized") == []
    # The next pass asks again, from the same (largest) cluster.
    report = await synthesize(app)
    assert report.drafted == 1
    [skill] = await catalogue(sstub)
    assert skill.name == "routine" and skill.cluster_size == 5


async def test_a_full_catalogue_asks_no_model(make_settings, dsn, clock, scripted_openai):
    settings = scripted_settings(make_settings, scripted_openai, max_skills_per_agent=1)
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        estub, sstub = stubs(app)
        for i in range(3):
            await record(estub, clock, f"z{i}", Z)
        await create_unrelated_skill(sstub, "only")
        report = await synthesize(app)
        assert (report.catalogue_full, report.drafted) == (1, 0)
        assert scripted_openai.received("chat") == []


async def test_a_model_that_does_not_answer_costs_the_seat_its_draft_not_the_pass(app, clock, scripted_openai):
    estub, sstub = stubs(app)
    for i in range(3):
        await record(estub, clock, f"z{i}", Z)
        await record(estub, clock, f"bob-z{i}", Z, seat="bob")
    scripted_openai.push("chat", Reply(status=500))
    report = await synthesize(app)
    assert report.drafted == 1 and report.failures == {"unavailable:server_error": 1}
    assert len(await catalogue(sstub)) + len(await catalogue(sstub, "bob")) == 1


async def test_with_no_model_the_offline_rule_drafts_a_skill_md(make_settings, dsn, clock):
    settings = make_settings(providers={"embeddings": {"kind": "none"}})
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        estub, sstub = stubs(app)
        for turn_id, tools in X.items():
            await record(estub, clock, turn_id, tools)
        report = await synthesize(app)
        assert report.drafted == 1
        [skill] = await catalogue(sstub)
        assert skill.cluster_size == 5 and list(skill.tool_sequence) == X["x4"]
        body = skill.body
        assert body.startswith(f"---\nname: {skill.name}\n")
        steps = body.split("## Steps\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert steps == [f"{i}. Call `{t}`." for i, t in enumerate(X["x4"], 1)]
        assert "- Work woken by: Message from Ana: Slack message" in body
        assert "- Asked like: please handle x4" in body
        assert skill.name.startswith("c-to-d-routine-") and "done 5 of 5" in skill.summary
        [spend] = await read_events(app.infra.pool, "auxiliary_spend")
        assert spend["payload"]["provider"] == "offline"


async def test_the_pass_is_registered_off_by_default(make_settings, dsn, clock):
    async with open_app(make_settings(), dsn, names=["episodes", "skills"], clock=clock) as app:
        spec = app.passes()["skill-synthesis"]
        assert spec.enabled is False and spec.interval_seconds == 86400
        curator = app.passes()["skill-curator"]
        assert curator.enabled is True and curator.interval_seconds == 24 * 3600
    settings = make_settings(learning={"skill_synthesis": {"scheduler_enabled": True}})
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        assert app.passes()["skill-synthesis"].enabled is True


# ------------------------------------------------------------------------ learned, refused, seats


async def test_an_archived_skills_recurring_shape_is_learned_and_the_next_cluster_is_drafted(
    app, clock, scripted_openai
):
    estub, sstub = stubs(app)
    for turn_id, tools in X.items():
        await record(estub, clock, turn_id, tools)
    assert (await synthesize(app)).drafted == 1
    [x_skill] = await catalogue(sstub)
    await sstub.ArchiveSkill(pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=x_skill.id))
    # X's shape recurs (four fresh turns, the largest cluster), and a new pattern Y (three) appears.
    for i in range(4):
        await record(estub, clock, f"x-again{i}", X["x4"])
    for i in range(3):
        await record(estub, clock, f"y{i}", Y)

    report = await synthesize(app)
    # The archived skill is learned: X is skipped (not redrafted under its own name), Y is drafted.
    assert (report.drafted, report.skipped_duplicate, report.dropped) == (1, 1, 0)
    assert len(scripted_openai.received("chat")) == 2
    [y_skill] = await catalogue(sstub)
    assert list(y_skill.tool_sequence) == Y and y_skill.cluster_size == 3
    for i in range(4):
        assert await consolidated(estub, f"x-again{i}") == ""
    archived = await sstub.GetSkill(pb.GetSkillRequest(company="acme", seat="ana", skill_id=x_skill.id))
    assert archived.skill.state == pb.SKILL_STATE_ARCHIVED  # an operator's to restore, not the pass's


async def test_a_draft_refused_for_a_name_the_seat_has_moves_on_to_the_next_cluster(app, clock, scripted_openai):
    estub, sstub = stubs(app)
    for turn_id, tools in X.items():
        await record(estub, clock, turn_id, tools)
    for i in range(3):
        await record(estub, clock, f"z{i}", Z)
    await create_unrelated_skill(sstub, "taken")

    def handler(body: dict) -> str:
        if representative_of(body) == X["x4"]:
            return json.dumps({"name": "taken", "summary": "x work", "body": "# taken\n"})
        return draft_from_prompt(body)

    scripted_openai.chat_handler = handler
    report = await synthesize(app)
    assert (report.drafted, report.dropped) == (1, 1)
    assert len(scripted_openai.received("chat")) == 2
    clustered = [s for s in await catalogue(sstub) if s.trigger == pb.SKILL_TRIGGER_CLUSTERED]
    assert [tuple(s.tool_sequence) for s in clustered] == [tuple(Z)]
    assert await consolidated(estub, "x1") == ""


async def test_each_seat_drafts_through_its_own_roles_chain(make_settings, dsn, clock, scripted_openai):
    scripted_openai.chat_handler = draft_from_prompt
    settings = scripted_settings(
        make_settings,
        scripted_openai,
        extra={"company_defaults": {"roles": {"swe": {"llm_auxiliary": ["offline"]}, "quiet": {"llm_auxiliary": []}}}},
    )
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        estub, sstub = stubs(app)
        for seat, role in (("ana", "swe"), ("bob", "quiet"), ("cy", "")):
            for i in range(3):
                await record(estub, clock, f"{seat}-z{i}", Z, seat=seat, role=role)
        report = await synthesize(app)
        # ana: swe's chain (the offline rule); bob: a role with no chain drafts nothing and is
        # charged nothing; cy: no role, the default chain (the scripted model).
        assert (report.drafted, report.seats_without_model, report.failures) == (2, 1, {})
        assert len(scripted_openai.received("chat")) == 1
        assert "please handle cy-z" in scripted_openai.received("chat")[0]["messages"][1]["content"]
        [ana] = await catalogue(sstub, "ana")
        assert "-routine-" in ana.name  # the offline rule's name
        assert await catalogue(sstub, "bob") == []
        assert len(await catalogue(sstub, "cy")) == 1
        spend = await read_events(app.infra.pool, "auxiliary_spend")
        assert sorted((e["seat"], e["payload"]["provider"]) for e in spend) == [
            ("ana", "offline"),
            ("cy", "scripted"),
        ]
        [done] = await read_events(app.infra.pool, "skill_synthesis_completed")
        assert done["payload"]["seats_without_model"] == 1


async def test_one_seats_fault_is_counted_and_the_next_seat_is_drafted(app, clock, scripted_openai, caplog):
    """A real fault confined to one seat: its draft's body holds U+0000, which PostgreSQL text
    cannot store, so its insert fails. The seat is logged and counted; the seat after it drafts."""
    estub, sstub = stubs(app)
    for i in range(3):
        await record(estub, clock, f"z{i}", Z)  # ana, the first seat listed
        await record(estub, clock, f"bob-z{i}", Z, seat="bob")

    def handler(body: dict) -> str:
        if "please handle bob-z" in body["messages"][1]["content"]:
            return draft_from_prompt(body)
        return json.dumps({"name": "poison", "summary": "s", "body": "# poison\n\u0000\n"})

    scripted_openai.chat_handler = handler
    caplog.set_level("ERROR", logger="services.skills.passes")
    report = await synthesize(app)
    assert (report.seats, report.drafted, report.seats_failed) == (2, 1, 1)
    [(kind, count)] = report.failures.items()
    assert kind.startswith("seat:") and count == 1
    assert await catalogue(sstub) == [] and len(await catalogue(sstub, "bob")) == 1
    assert any("acme/ana" in r.getMessage() for r in caplog.records if r.name == "services.skills.passes")
    [done] = await read_events(app.infra.pool, "skill_synthesis_completed")
    assert done["payload"]["seats_failed"] == 1 and done["payload"]["drafted"] == 1


async def test_a_compactions_retained_exemplars_are_not_evidence(make_settings, dsn, clock):
    """Three old turns fold into a summary that keeps two of them raw as exemplars; with one fresh
    turn of the same shape, counting the exemplars would make a cluster of three out of one fold."""
    settings = make_settings(
        providers={"embeddings": {"kind": "none"}},
        learning={"episode_lifecycle": {"max_raw_episodes_per_agent": 2}},
    )
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        estub, sstub = stubs(app)
        for i in range(3):
            await record(estub, clock, f"old{i}", Z)
        clock.advance(days=40)
        await record(estub, clock, "fresh", Z)
        lifecycle = await app.passes()["episode-lifecycle"].run()
        assert (lifecycle.clusters_compacted, lifecycle.exemplars_kept) == (1, 2)
        report = await synthesize(app)
        assert (report.seats_with_clusters, report.drafted) == (0, 0)
        assert await catalogue(sstub) == []


async def test_a_members_ask_and_account_reach_the_prompt_whole_or_named_by_size(
    make_settings, dsn, clock, scripted_openai
):
    scripted_openai.chat_handler = draft_from_prompt
    settings = scripted_settings(
        make_settings, scripted_openai, extra={"learning": {"episodes": {"summary_input_bytes": 3000}}}
    )
    long_ask = "Please rebuild the release notes. " + " ".join(f"Item {i} needs a line of its own." for i in range(60))
    huge_ask = "Please triage the incident. " + "Traceback frame in module.py line 7. " * 120
    assert 600 < len(long_ask) < 2900 and len(huge_ask.encode()) > 3000
    async with open_app(settings, dsn, names=["episodes", "skills"], clock=clock) as app:
        estub, _ = stubs(app)
        await record(estub, clock, "x1", X["x1"], ask=long_ask)
        await record(estub, clock, "x2", X["x2"], ask=huge_ask)
        await record(estub, clock, "x4", X["x4"])
        assert (await synthesize(app)).drafted == 1
        [call] = scripted_openai.received("chat")
        prompt = call["messages"][1]["content"]
        assert f"asked: {long_ask}" in prompt  # whole: past the old 600-character cut
        assert f"asked: [ask of {len(huge_ask.encode())} bytes not shown]" in prompt
        assert "what it did: handled x2" in prompt  # the short account still shown whole
        assert "[cut]" not in prompt and "Traceback" not in prompt


async def test_a_draft_whose_source_turns_an_erasure_took_during_its_model_call_is_not_written(
    make_settings, dsn, clock, scripted_openai, local_embedder, edge_index
):
    """The model call is held; meanwhile an erasure of the person every member answered runs to
    SUCCEEDED (verified): her episodes are gone. The draft, answered after, is not written — the
    pass re-reads its members before CreateSkill; it used to write her run ids and handle into a
    skill after the receipt."""
    import asyncio
    import threading

    import asyncpg

    from agentlearn.common.v1 import erasure_pb2 as er
    from agentlearn.privacy.v1 import privacy_service_pb2 as pv
    from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc

    names = ["diary", "episodes", "skills", "profiles", "reflector", "knowledge", "prefetch", "sessions"]
    names += ["telemetry", "privacy"]
    settings = make_settings(
        providers={
            "llm": {"scripted": openai_provider(scripted_openai, "scripted-chat")},
            "auxiliary_chain": ["scripted"],
        },
    )
    hold = threading.Event()
    scripted_openai.chat_handler = draft_from_prompt
    scripted_openai.rule("chat", lambda body: Reply(hold=hold, body=None))
    async with open_app(settings, dsn, names=names, clock=clock, embedder=local_embedder, index=edge_index) as app:
        estub = epb_grpc.EpisodeServiceStub(app.channel)
        for turn_id, tools in X.items():
            await record(estub, clock, turn_id, tools)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("UPDATE episodes SET subjects = ARRAY['carla']")  # she asked every one
            task = asyncio.create_task(app.passes()["skill-synthesis"].run())
            async with asyncio.timeout(30):
                while not scripted_openai.held:
                    await asyncio.sleep(0.02)
            privacy = pv_grpc.PrivacyServiceStub(app.channel)
            subject = er.ErasureSubject(handle="carla")
            resp = await privacy.EraseSubject(pv.EraseSubjectRequest(company="acme", subject=subject))
            await app.components["privacy"].service.worker.drain()
            got = (await privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
            assert got.state == pv.ERASURE_STATE_SUCCEEDED and got.verified, got.reason
            assert await conn.fetchval("SELECT count(*) FROM episodes") == 0
            hold.set()
            report = await task
            assert (report.drafted, report.sources_gone) == (0, 1)
            assert await conn.fetchval("SELECT count(*) FROM synthesized_skills") == 0
        finally:
            hold.set()
            await conn.close()
