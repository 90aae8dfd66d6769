"""Cross-agent promotion (spec: "Cross-agent promotion is the third path") over the real episodes,
skills and knowledge services: distinct seats of one unit converging on a tool run yield ONE draft
page under the unit's Auto-Drafted Skills parent, hidden from every seat's search, announced once
with skill_promoted, never a skill row, and still one page when the cluster's representative moves
on a later tick; one seat repeating itself is not a convergence; units do
not pool; a unit with no container is soft-skipped naming the key to set; a write failure announces
nothing and the next tick retries; the distillation is one attributed background call (a scripted
model, and the offline rule)."""

from __future__ import annotations

import json
import logging

import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as epb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as epb_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kpb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kpb_grpc
from libs.common.events import read_events
from services.knowledge.domain import AUTO_DRAFTED_PARENT
from services.knowledge.promotion import Run, cluster_runs, draft_title
from services.skills.domain import Turn
from tests.support.app import App, open_app
from tests.support.scripted_confluence import Reply, ScriptedConfluence
from tests.support.scripted_openai import openai_provider
from tests.support.turns import raw_episode

RUN = ["jira_get", "vault_read", "vault_write", "deploy", "slack_post"]
NEAR = ["jira_get", "vault_read", "vault_write", "deploy", "slack_post", "pagerduty_ack"]  # Jaccard 5/6
OTHER = ["github_pr", "github_review", "github_merge", "ci_run", "ci_logs"]
NAMES = ["episodes", "skills", "knowledge"]


def settings(make_settings, **extra):  # type: ignore[no-untyped-def]
    learning = {"promotion": {"enabled": True, "min_sibling_count": 3}, **extra.pop("learning", {})}
    knowledge = extra.pop("knowledge", {})
    providers = extra.pop("providers", {"embeddings": {"kind": "none"}})
    return make_settings(
        providers=providers,
        learning=learning,
        knowledge=knowledge,
        companies={
            "acme": {
                "roles": {
                    "sre": {"unit": "platform", "knowledge_containers": ["plat"]},
                    "dba": {"unit": "platform-db"},
                    "analyst": {"unit": "data"},
                    "freelancer": {},
                },
                "knowledge": {"unit_containers": {"platform": "plat", "platform-db": "pdb"}},
            }
        },
        **extra,
    )


class Env:
    def __init__(self, app: App, clock):  # type: ignore[no-untyped-def]
        self.app, self.clock = app, clock
        self.episodes = epb_grpc.EpisodeServiceStub(app.channel)
        self.knowledge = kpb_grpc.KnowledgeServiceStub(app.channel)
        self._n = 0

    async def run(self, seat: str, tools, role: str = "sre", outcome=epb.TURN_OUTCOME_DONE) -> None:  # type: ignore[no-untyped-def]
        self._n += 1
        self.clock.advance(minutes=1)
        end = self.clock.now()
        ask = f"rotate the api keys of service {self._n}"
        request = raw_episode(
            seat,
            f"run-{self._n}",
            end,
            "Jira issue assigned",
            ask,
            "Rotated and redeployed.",
            tools,
            outcome,
            minutes=0.5,
            role=role,
            tools_called=list(tools),
            subjects=[f"lead-of-{seat}"],  # who asked: a draft from the run rests on them
        )
        await self.episodes.RecordEpisode(request)

    async def promote(self):  # type: ignore[no-untyped-def]
        return await self.app.passes()["skill-promotion"].run()

    async def events(self, kind: str) -> list[dict]:
        return [dict(e) for e in await read_events(self.app.infra.pool, kind)]

    async def pages(self) -> list[tuple[str, str, list[str]]]:
        rows = await self.app.infra.pool.fetch(
            "SELECT container, title, parent_titles FROM knowledge_pages ORDER BY container, title"
        )
        return [(r["container"], r["title"], list(r["parent_titles"])) for r in rows]


@pytest.fixture
async def env(make_settings, dsn, clock):
    async with open_app(settings(make_settings), dsn, names=NAMES, clock=clock) as app:
        yield Env(app, clock)


async def converge(env: Env, seats=("ana", "bo", "cy"), role: str = "sre") -> None:  # type: ignore[no-untyped-def]
    for seat in seats:
        await env.run(seat, RUN, role)
        await env.run(seat, NEAR, role)


async def test_converging_seats_make_one_hidden_draft_announced_once_and_never_a_skill(env):
    await converge(env)
    await env.run("dee", OTHER)
    report = await env.promote()
    assert (report.promoted, report.units_converged) == (1, 1)

    [(parent_c, parent_t, parent_p), (draft_c, title, parents)] = await env.pages()
    assert (parent_c, parent_t, parent_p) == ("plat", AUTO_DRAFTED_PARENT, [])
    assert (
        draft_c == "plat"
        and parents == [AUTO_DRAFTED_PARENT]
        and title.startswith("Team routine: deploy, jira_get, pagerduty_ack, slack_post +2 more (")
    )
    [event] = await env.events("skill_promoted")
    payload = event["payload"]
    assert (payload["unit"], payload["container_key"], payload["page_title"]) == ("platform", "plat", title)
    assert (payload["sibling_count"], payload["distinct_agents"]) == (6, 3)
    assert await env.app.infra.pool.fetchval("SELECT count(*) FROM synthesized_skills") == 0

    # Hidden from every seat until a lead moves it; an operator sees it waiting.
    found = await env.knowledge.SearchPages(
        kpb.SearchPagesRequest(reader=kpb.Reader(company="acme", seat="ana", role="sre"), query="vault deploy")
    )
    assert found.served_mode == kpb.SERVED_MODE_NATIVE and not found.hits
    waiting = await env.knowledge.ListPages(
        kpb.ListPagesRequest(
            reader=kpb.Reader(company="acme"),
            container="plat",
            parent_title=AUTO_DRAFTED_PARENT,
            include_drafts=True,
            view=kpb.PAGE_VIEW_FULL,
        )
    )
    [page] = waiting.pages
    assert page.id == payload["page_id"] and "## Steps" in page.body and "3 agents of unit platform" in page.body

    # The next tick finds the draft and stays quiet: no model call, no page, no announcement.
    calls = len(await env.events("auxiliary_spend"))
    again = await env.promote()
    assert (again.promoted, again.already_drafted) == (0, 1)
    assert len(await env.events("skill_promoted")) == 1 and len(await env.pages()) == 2
    assert len(await env.events("auxiliary_spend")) == calls


async def test_a_converging_cluster_whose_representative_moves_is_still_one_page(env):
    # Tick 1: three seats ran RUN and one ran NEAR as well; RUN is the medoid and titles the draft.
    for seat in ("ana", "bo", "cy"):
        await env.run(seat, RUN)
    await env.run("ana", NEAR)
    first = await env.promote()
    assert first.promoted == 1
    [(_, _, _), (_, title, _)] = await env.pages()
    # Tick 2: more seats run NEAR. Still one cluster (7 runs, 4 seats), but its medoid is now a
    # NEAR run, whose tool set names another title: the convergence is the one already drafted.
    for seat in ("bo", "cy", "dee"):
        await env.run(seat, NEAR)
    runs = [Run(s, Turn(turn_id=s, tool_sequence=tuple(t))) for s, t in [("a", RUN)] * 3 + [("b", NEAR)] * 4]
    [cluster] = cluster_runs(runs, 0.6)
    assert draft_title(cluster.representative()) != title  # the premise: the representative moved
    calls = len(await env.events("auxiliary_spend"))
    again = await env.promote()
    assert (again.units_converged, again.promoted, again.already_drafted) == (1, 0, 1)
    assert [t for _, t, _ in await env.pages()] == [AUTO_DRAFTED_PARENT, title]
    assert len(await env.events("skill_promoted")) == 1
    assert len(await env.events("auxiliary_spend")) == calls


async def test_a_draft_a_lead_rejected_is_drafted_again_only_when_the_team_converges_again(env):
    await converge(env)
    assert (await env.promote()).promoted == 1
    [event] = await env.events("skill_promoted")
    # The lead rejects the draft: a delete (on native pages, the operator's SQL).
    await env.app.infra.pool.execute("DELETE FROM knowledge_pages WHERE id = $1::uuid", event["payload"]["page_id"])
    # An erasure takes a person's runs out of the record of a draft kept elsewhere and keeps the
    # rest (erasure.py's scrub): the record still names the convergence without them.
    await env.app.infra.pool.execute(
        """UPDATE draft_provenance SET seats = array_remove(seats, 'ana'),
               sources = (SELECT jsonb_agg(s) FROM jsonb_array_elements(sources) s WHERE s->>'seat' <> 'ana'),
               turn_ids = ARRAY(SELECT s->>'turn_id' FROM jsonb_array_elements(sources) s WHERE s->>'seat' <> 'ana')"""
    )
    calls = len(await env.events("auxiliary_spend"))

    # The same runs re-clustered the next day: no model call, no page, no announcement.
    again = await env.promote()
    assert (again.units_converged, again.promoted, again.rejected) == (1, 0, 1)
    # One seat running it since is no convergence either.
    await env.run("ana", RUN)
    still = await env.promote()
    assert (still.promoted, still.rejected) == (0, 1)
    assert [t for _, t, _ in await env.pages()] == [AUTO_DRAFTED_PARENT]
    assert len(await env.events("skill_promoted")) == 1 and len(await env.events("auxiliary_spend")) == calls

    # Three seats converge on it again since: drafted again, announced again.
    await converge(env, seats=("bo", "cy", "dee"))
    back = await env.promote()
    assert (back.promoted, back.rejected) == (1, 0)
    assert len(await env.events("skill_promoted")) == 2 and len(await env.pages()) == 2


async def test_one_seat_repeating_itself_is_not_a_team_convergence(env):
    for _ in range(6):
        await env.run("ana", RUN)
    await env.run("bo", RUN)
    report = await env.promote()
    assert report.units_converged == 0 and await env.pages() == []
    assert await env.events("skill_promoted") == []


async def test_only_direct_members_pool(env):
    # Two seats of platform and one of platform-db ran the same thing: neither unit converged.
    await converge(env, seats=("ana", "bo"))
    await converge(env, seats=("cy",), role="dba")
    await env.run("fay", RUN, role="freelancer")  # a role with no unit is in no unit at all
    report = await env.promote()
    assert report.units == 2 and report.units_converged == 0 and await env.pages() == []


async def test_a_unit_with_no_container_is_soft_skipped_naming_the_key_to_set(env, caplog):
    await converge(env, role="analyst")
    await converge(env, seats=("dan", "eve", "fox"))
    with caplog.at_level(logging.INFO, logger="services.knowledge.promotion"):
        report = await env.promote()
    assert (report.units_without_container, report.promoted) == (1, 1)  # the configured unit still promotes
    assert "companies.acme.knowledge.unit_containers.data" in caplog.text
    [event] = await env.events("skill_promoted")
    assert event["payload"]["unit"] == "platform"


async def test_the_distillation_is_one_background_call_for_the_representatives_seat(
    make_settings, dsn, clock, scripted_openai
):
    answers = [
        json.dumps({"summary": "", "body": ""}),  # no page: nothing written
        json.dumps({"summary": "How we rotate keys.", "body": "## Steps\n\n1. Read the secret.\n2. Deploy."}),
    ]
    scripted_openai.chat_handler = lambda body: answers.pop(0)
    providers = {
        "embeddings": {"kind": "none"},
        "llm": {"scripted": openai_provider(scripted_openai, "m")},
        "auxiliary_chain": ["scripted"],
    }
    async with open_app(settings(make_settings, providers=providers), dsn, names=NAMES, clock=clock) as app:
        env = Env(app, clock)
        await converge(env)
        dropped = await env.promote()
        assert (dropped.dropped, dropped.promoted) == (1, 0) and await env.pages() == []
        report = await env.promote()
        assert report.promoted == 1
        [_, (_, title, _)] = await env.pages()
        body = await app.infra.pool.fetchval("SELECT body FROM knowledge_pages WHERE title = $1", title)
        assert body.startswith("How we rotate keys.\n\n## Steps\n\n1. Read the secret.")
        spends = [e for e in await env.events("auxiliary_spend") if e["payload"]["purpose"] == "skill_promotion"]
        assert len(spends) == 2 and {e["payload"]["stage"] for e in spends} == {"background"}
        assert {e["seat"] for e in spends} <= {"ana", "bo", "cy"}
        [request] = scripted_openai.received("chat")[-1:]
        prompt = request["messages"][1]["content"]
        assert "3 agents ran this kind of tool run, 6 runs in all" in prompt and "agent: ana" in prompt


async def test_a_write_failure_announces_nothing_and_the_next_tick_retries(make_settings, dsn, clock):
    site = ScriptedConfluence().start()
    site.add_user("org-token", "bot")
    try:
        conf = {"confluence": {"base_url": site.base_url, "token": "org-token"}}
        async with open_app(settings(make_settings, knowledge=conf), dsn, names=NAMES, clock=clock) as app:
            env = Env(app, clock)
            await converge(env)
            site.rule = lambda rec: Reply(500, {"message": "boom"}) if rec.method == "POST" else None
            failed = await env.promote()
            assert (failed.write_failures, failed.promoted) == (1, 0)
            assert await env.events("skill_promoted") == [] and site.pages == {}

            site.rule = None
            report = await env.promote()
            assert report.promoted == 1
            parent = site.titled("plat", AUTO_DRAFTED_PARENT)
            [draft] = [p for p in site.pages.values() if p.parent == parent.id]
            assert draft.title.startswith("Team routine:") and "<h2>Steps</h2>" in draft.body
            [event] = await env.events("skill_promoted")
            assert (event["payload"]["page_id"], event["payload"]["backend"]) == (draft.id, "confluence")
            await app.components["knowledge"].service.backend.primary.client.close()
    finally:
        site.stop()


def test_the_title_is_the_same_for_the_same_tool_set_and_clusters_count_seats():
    def run(seat: str, tools, turn: str) -> Run:  # type: ignore[no-untyped-def]
        return Run(seat, Turn(turn_id=turn, tool_sequence=tuple(tools)))

    # Another member (another order, repeats) may be the representative next tick: the same title.
    assert draft_title(run("a", RUN, "1")) == draft_title(run("b", list(reversed(RUN)) + RUN, "2"))
    assert draft_title(run("a", RUN, "1")) != draft_title(run("a", OTHER, "1"))
    clusters = cluster_runs([run("a", RUN, "1"), run("a", RUN, "2"), run("b", NEAR, "3"), run("c", OTHER, "4")], 0.6)
    assert [(c.size, c.distinct_agents) for c in clusters] == [(3, 2), (1, 1)]


async def test_a_draft_whose_source_run_was_erased_during_its_model_call_is_not_written(
    make_settings, dsn, clock, scripted_openai
):
    """The distillation is held; meanwhile the episodes owner erases the runs one asker's messages
    began (her erasure's episodes step). The page, answered after, is not written, nor its provenance
    record: the pass re-reads the cluster's runs first; it used to file her run ids and handle."""
    import asyncio
    import threading
    import uuid

    from agentlearn.common.v1 import erasure_pb2 as er
    from tests.support.scripted_openai import Reply

    hold = threading.Event()
    page = json.dumps({"summary": "How we rotate keys.", "body": "## Steps\n\n1. Read the secret.\n2. Deploy."})
    scripted_openai.chat_handler = lambda body: page
    scripted_openai.rule("chat", lambda body: Reply(hold=hold, body=None))
    providers = {
        "embeddings": {"kind": "none"},
        "llm": {"scripted": openai_provider(scripted_openai, "m")},
        "auxiliary_chain": ["scripted"],
    }
    async with open_app(settings(make_settings, providers=providers), dsn, names=NAMES, clock=clock) as app:
        env = Env(app, clock)
        await converge(env)
        task = asyncio.create_task(env.promote())
        try:
            async with asyncio.timeout(30):
                while not scripted_openai.held:
                    await asyncio.sleep(0.02)
            target = er.ErasureTarget(
                erasure_id=str(uuid.uuid4()),
                company="acme",
                kind=er.ERASURE_KIND_SUBJECT,
                subject=er.ErasureSubject(handle="lead-of-ana"),
            )
            erased = await env.episodes.EraseRows(epb.EraseRowsRequest(target=target))
            assert sum(t.count for t in erased.report.tables if t.table == "episodes") == 2
        finally:
            hold.set()
        report = await task
        assert (report.promoted, report.sources_gone) == (0, 1), report
        assert await app.infra.pool.fetchval("SELECT count(*) FROM knowledge_pages WHERE body LIKE '%rotate%'") == 0
        assert await env.events("skill_promoted") == []
