"""What the inspector tests share (no tests here): every service served for real over gRPC with the
HTTP app ``./run up`` serves (``services.runner.cli.http_app``, the same middleware and routes) on
a loopback port, and a seeded company written through the owning services' own RPCs: notes,
episodes folded by the lifecycle pass, skills with versions, a proposal, a profile, reflections,
turn starts, auxiliary spend and a session learning check; plus another company whose names must
never appear on the first company's pages."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kn_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as prof_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as ss_grpc
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from libs.common.auth import Authenticator
from libs.common.channels import IdentityInterceptor
from libs.common.clock import ManualClock
from libs.common.httpserver import start_http
from services.runner.cli import http_app
from services.runner.registry import SERVICES
from tests.support.app import App, open_app
from tests.support.sessions import result, user, verification
from tests.support.skills import skill_request
from tests.support.turns import message, raw_episode, turn

__all__ = ["NOW", "Inspector", "Seeded", "csrf_of", "inspector_settings", "open_inspector", "seed"]

NOW = datetime(2026, 5, 20, 12, 0, tzinfo=UTC)
BODY_V1 = "# Deploy checklist\n\n1. Freeze merges.\n2. Run the smoke tests.\n3. Deploy to staging.\n"
BODY_V2 = (
    "# Deploy checklist\n\n1. Freeze merges.\n2. Run the smoke tests and the migrations check.\n3. Deploy to staging.\n"
)
BODY_V3 = BODY_V2 + "4. Announce in #releases.\n"
SIMILAR = ["jira.search", "jira.update", "slack.post"]
DEPLOY_TOOLS = ["ci.run", "deploy.staging"]
JIRA, SLACK = "Message from Bob: Jira ticket", "Message from Bob: Slack message"


def _overrides(**extra: Any) -> dict[str, Any]:
    """One role, the episode lifecycle's gate low enough that four old similar turns fold; ``extra``
    over them."""
    return {
        "companies": {"acme": {"roles": {"swe": {}}}, "globex": {"roles": {"swe": {}}}},
        "learning": {"episode_lifecycle": {"max_raw_episodes_per_agent": 5, "compaction_min_cluster_size": 3}},
        **extra,
    }


def inspector_settings(make_settings, **extra):  # type: ignore[no-untyped-def]
    return make_settings(**_overrides(**extra))


def csrf_of(html: str) -> str:
    """The form token a page carries."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page carries no form token"
    return found.group(1)


@dataclass
class Seeded:
    """Ids of what ``seed`` wrote."""

    notes: dict[str, str] = field(default_factory=dict)
    skill_id: str = ""
    other_skill_id: str = ""
    proposal_id: str = ""
    compacted_id: str = ""
    exemplars: list[str] = field(default_factory=list)
    session_id: str = "sess-ana-1"
    check_id: str = ""
    globex_note: str = ""
    draft_id: str = ""


@dataclass
class Inspector:
    app: App
    base_url: str
    channel: grpc.aio.Channel
    """A channel to the services carrying the service identity (seeding and checks in tests)."""
    clock: ManualClock

    def stub(self, stub_class: Any) -> Any:
        return stub_class(self.channel)

    @property
    def diary(self) -> diary_grpc.DiaryServiceStub:
        return diary_grpc.DiaryServiceStub(self.channel)

    @property
    def skills(self) -> sk_grpc.SkillServiceStub:
        return sk_grpc.SkillServiceStub(self.channel)

    async def token(self, company: str, *scopes: str, **bound: str) -> str:
        token, _ = await self.app.infra.tokens.issue(company, list(scopes), **bound)
        return token

    def client(self, **kw: Any) -> httpx.AsyncClient:
        kw.setdefault("timeout", 60)
        return httpx.AsyncClient(base_url=self.base_url, **kw)

    @contextlib.asynccontextmanager
    async def signed_in(self, token: str) -> AsyncIterator[httpx.AsyncClient]:
        """An HTTP client that signed in through the form (cookie jar and all)."""
        async with self.client() as client:
            page = await client.get("/inspector/signin")
            resp = await client.post(
                "/inspector/signin", data={"csrf": csrf_of(page.text), "token": token, "next": "/inspector/"}
            )
            assert resp.status_code == 303, resp.text
            yield client


@contextlib.asynccontextmanager
async def open_inspector(
    settings, dsn, clock, *, embedder, index, auth_mode="tokens", names=None
) -> AsyncIterator[Inspector]:  # type: ignore[no-untyped-def]
    """``names``: the services served (default every one); a service left out is reached at its
    configured address (``services.<name>``)."""
    async with open_app(
        settings, dsn, names=names or list(SERVICES), clock=clock, embedder=embedder, index=index, auth_mode=auth_mode
    ) as app:
        authenticator = Authenticator(
            app.infra.tokens,
            app.infra.clock,
            mode=auth_mode,
            cache_seconds=0,
            internal_secret=app.infra.internal_secret,
        )
        server = await start_http(http_app(list(app.components.values()), authenticator), "127.0.0.1", 0)
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{app.port}", interceptors=[IdentityInterceptor(app.infra.internal_secret, "inspector-tests")]
        )
        try:
            yield Inspector(app, f"http://{server.address}", channel, clock)
        finally:
            await channel.close()
            await server.stop()


async def seed(env: Inspector) -> Seeded:
    """Company ``acme``: seat ``ana`` with everything, seat ``bo`` with a little; company ``globex``
    with names that must never show on acme's pages."""
    ch, clock, out = env.channel, env.clock, Seeded()
    diary, episodes = diary_grpc.DiaryServiceStub(ch), ep_grpc.EpisodeServiceStub(ch)
    skills, profiles = sk_grpc.SkillServiceStub(ch), prof_grpc.ProfileServiceStub(ch)
    reflector, prefetch = rf_grpc.ReflectorServiceStub(ch), pf_grpc.PrefetchServiceStub(ch)
    sessions = ss_grpc.SessionServiceStub(ch)

    clock.set(NOW - timedelta(days=6))
    for key, content, tier, ttl in [
        ("bob", "Bob wants the deploy report every Friday.", diary_pb.NOTE_TIER_LONG, 0),
        ("staging", "Staging deploys need the release manager's approval.", diary_pb.NOTE_TIER_LONG, 0),
        ("freeze", "Merge freeze this week until Thursday.", diary_pb.NOTE_TIER_SHORT, 7),
    ]:
        clock.advance(seconds=1)
        resp = await diary.WriteNote(
            diary_pb.WriteNoteRequest(company="acme", seat="ana", content=content, tier=tier, ttl_days=ttl)
        )
        out.notes[key] = resp.note.id
    await diary.WriteNote(
        diary_pb.WriteNoteRequest(
            company="acme", seat="bo", content="Bo keeps the on-call rota.", tier=diary_pb.NOTE_TIER_LONG
        )
    )
    # Turn starts on five days (each records its prefetch_summary and the auxiliary calls it made).
    for day in range(5):
        clock.advance(days=1)
        ask = "When is Bob's deploy report due?" if day % 2 == 0 else "Summarize the kafka incident for the team"
        await prefetch.BuildTurnContext(
            pf_pb.BuildTurnContextRequest(company="acme", seat="ana", role="swe", turn_id=f"start-{day}", ask=ask)
        )
    clock.set(NOW)

    # Four old turns alike (they fold into one compacted row) and two recent ones.
    for i in range(4):
        end, ticket = clock.now() - timedelta(days=40, hours=i), f"OPS-{100 + i}"
        asked, did = f"Please update ticket {ticket}", f"Updated {ticket} and told Bob."
        old = raw_episode("ana", f"old-{i}", end, JIRA, asked, did, SIMILAR, minutes=5, tools_called=SIMILAR)
        await episodes.RecordEpisode(old)
    for i, (ask, did) in enumerate(
        [
            ("Why did the kafka consumer stall?", "Pinned the consumer group and reran CI."),
            ("Draft the release notes for 4.2", "Wrote the release notes from the merged PRs."),
        ]
    ):
        end, tools = clock.now() - timedelta(hours=2 - i), [f"tool.{i}"]
        recent = raw_episode("ana", f"recent-{i}", end, SLACK, ask, did, tools, minutes=3, tools_called=tools)
        await episodes.RecordEpisode(recent)
    await env.app.passes()["episode-lifecycle"].run()
    listed = await episodes.ListEpisodes(
        ep_pb.ListEpisodesRequest(
            company="acme", seat="ana", filter=ep_pb.EpisodeFilter(kind=ep_pb.EPISODE_KIND_COMPACTED)
        )
    )
    (compacted,) = listed.episodes
    out.compacted_id, out.exemplars = compacted.id, list(compacted.exemplar_turn_ids)

    created = await skills.CreateSkill(
        skill_request(
            "ana", "deploy-checklist", "Ship a release to staging safely", BODY_V1, DEPLOY_TOOLS, ["recent-0"]
        )
    )
    out.skill_id = created.skill.id
    for body, reason in [(BODY_V2, "add the migrations check"), (BODY_V3, "announce releases")]:
        clock.advance(minutes=1)
        await skills.RefineSkill(
            sk_pb.RefineSkillRequest(company="acme", seat="ana", skill_id=out.skill_id, body=body, reason=reason)
        )
    triage = ("triage-tickets", "Sort the morning's tickets", "# Triage\n\n1. Read.\n2. Label.\n")
    other = await skills.CreateSkill(skill_request("ana", *triage, ["jira.search", "jira.label"], ["recent-1"]))
    out.other_skill_id = other.skill.id
    await skills.UseSkill(sk_pb.UseSkillRequest(company="acme", seat="ana", skill_id=out.other_skill_id))
    proposed = await skills.ProposeSkill(
        sk_pb.ProposeSkillRequest(
            company="acme",
            seat="ana",
            name="rotate-api-keys",
            summary="Rotate a service's API keys without downtime",
            body="# Rotate API keys\n\n1. Issue the new key.\n2. Deploy it.\n3. Revoke the old one.\n",
            tool_sequence=["vault.issue", "deploy.staging", "vault.revoke"],
            origin=sk_pb.PROPOSAL_ORIGIN_SESSION_CHECK,
            source=sk_pb.ProposalSource(
                session_id=out.session_id, check_id="check-x", evidence_ids=["ev-7", "plan:2:s3"]
            ),
        )
    )
    out.proposal_id = proposed.proposal.id
    end, post = clock.now() - timedelta(hours=1), ["slack.post"]
    handover_turn = ("Schedule: on-call handover", "Hand over on-call", "Posted the handover.")
    await episodes.RecordEpisode(raw_episode("bo", "bo-0", end, *handover_turn, post, minutes=2, tools_called=post))
    handover_skill = ("handover", "Hand the on-call over", "# Handover\n\n1. Post.\n")
    await skills.CreateSkill(skill_request("bo", *handover_skill, post, ["bo-0"]))

    await profiles.UpsertProfile(
        prof_pb.UpsertProfileRequest(
            company="acme",
            observer="ana",
            subject=prof_pb.Subject(handle="bob", platform="slack"),
            communication_style="Terse; wants bullet points.",
            topics=["deploys", "kafka"],
            past_decisions=["Chose Friday reports"],
        )
    )

    # A finished turn reflected, and turn starts that record their prefetch and spend.
    clock.advance(minutes=1)
    await reflector.SubmitTurn(
        rf_pb.SubmitTurnRequest(
            turn=turn(
                "turn-reflected",
                now=clock.now(),
                messages=[message("bob", "Can you check the deploy?")],
                what_it_did="Checked the deploy; staging is green.",
            )
        )
    )
    await env.app.components["reflector"].service.harness.drain()
    # A session with a learning check that ran.
    t = clock.now()
    await sessions.AppendSessionEvents(
        ss_pb.AppendSessionEventsRequest(
            company="acme",
            session_id=out.session_id,
            user="dana",
            seat="ana",
            role="swe",
            events=[
                user("u1", "Remember: I review deploys on Tuesdays.", t, remember=True),
                result("r1", "make", "build ok", t),
                verification("v1", "pytest", "42 passed", t),
            ],
        )
    )
    check = await sessions.CheckRecentWork(
        ss_pb.CheckRecentWorkRequest(company="acme", session_id=out.session_id, user="dana")
    )
    out.check_id = check.check.check_id
    await env.app.components["sessions"].service.worker.drain()

    # A cross-agent promotion draft waiting for a lead, and one of globex's.
    knowledge = kn_grpc.KnowledgeServiceStub(ch)
    drafted = await knowledge.WritePromotionDraft(
        kn_pb.WritePromotionDraftRequest(
            company="acme",
            unit="platform",
            container_key="eng",
            title="[Auto-draft] Rotate on-call handover",
            body="# Rotate on-call handover\n\n1. Post the handover.\n2. Page the next on-call.\n",
            tool_sequence=["slack.post", "pager.page"],
            sibling_count=4,
            distinct_agents=3,
        )
    )
    out.draft_id = drafted.page_id
    await knowledge.WritePromotionDraft(
        kn_pb.WritePromotionDraftRequest(
            company="globex",
            unit="ops",
            container_key="ops",
            title="[Auto-draft] GLOBEX-SECRET-DRAFT",
            body="GLOBEX-SECRET-DRAFT-BODY",
            tool_sequence=["x.y"],
            sibling_count=3,
            distinct_agents=3,
        )
    )
    gx = await diary.WriteNote(
        diary_pb.WriteNoteRequest(
            company="globex", seat="carl", content="GLOBEX-SECRET-NOTE", tier=diary_pb.NOTE_TIER_LONG
        )
    )
    out.globex_note = gx.note.id
    secret = ("globex-secret-skill", "GLOBEX-SECRET-SUMMARY", "# secret\n")
    await skills.CreateSkill(skill_request("carl", *secret, ["x.y"], ["g-1"], company="globex"))
    clock.advance(minutes=1)  # the telemetry windows end at now, exclusive
    return out


@contextlib.asynccontextmanager
async def seeded_env(pg_uri: str, template_db: str, root, embedder, *, auth_mode: str = "tokens", **settings: Any):  # type: ignore[no-untyped-def]
    """A fresh database, every service, the HTTP app and the seeded company, for a whole test
    module (seeding is the slow part; the module's tests act on different rows)."""
    from libs.common.config import load_settings
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from tests.support.databases import scratch_database

    async with scratch_database(pg_uri, "i", template_db) as dsn:
        index = QdrantEdgeIndex(root / "edge")
        overrides = {"data_dir": str(root / "data"), **_overrides(**settings)}
        clock = ManualClock(NOW)
        try:
            async with open_inspector(
                load_settings(None, overrides, env={}), dsn, clock, embedder=embedder, index=index, auth_mode=auth_mode
            ) as env:
                seeded = await seed(env)
                yield env, seeded
        finally:
            await index.close()
