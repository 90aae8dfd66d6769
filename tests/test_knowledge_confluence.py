"""The Confluence backend against a scripted Confluence over real HTTP, through the knowledge service
over real gRPC: CQL ``text ~`` narrowed by ``space IN``, run as the seat's own user (the org token
otherwise), the ancestor exclusion of Auto-Drafted Skills and the client-side backstops, page
reads scoped like search, listings and search results paged by ``_links.next``, CQL escaping, a
refused credential, rate limits with ``Retry-After``, the onboarding pages, promotion drafts as
storage-format XHTML (the parent created, or the draft refused rather than filed at the root), and
the native ``workspace:`` containers searched beside it."""

from __future__ import annotations

import base64
import contextlib
import logging
from dataclasses import dataclass

import grpc
import pytest

from agentlearn.knowledge.v1 import knowledge_service_pb2 as pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as pb_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as ppb_grpc
from libs.common.events import read_events
from services.knowledge.backends import PromotionRefused, RoutedBackend
from services.knowledge.confluence import ConfluenceBackend, cql_string, render_storage, search_terms, storage_to_text
from services.knowledge.domain import AUTO_DRAFTED_PARENT, PromotionDraft
from tests.support.app import App, open_app
from tests.support.grpc_errors import error_info
from tests.support.scripted_confluence import Clause, Reply, ScriptedConfluence, parse_cql

ANA = "ana@acme.example:ana-api-token"  # Basic on the wire
ORG = "org-personal-access-token"  # Bearer on the wire


def basic(credential: str) -> str:
    return "Basic " + base64.b64encode(credential.encode()).decode()


@pytest.fixture
def site():
    server = ScriptedConfluence(max_limit=25).start()
    server.add_user(ORG, "agentlearn-bot")
    server.add_user(ANA, "ana", {"ENG", "OPS", "MISC"})
    server.add_user("zed-token", "zed", {"ZED"})
    yield server
    server.stop()


def settings_for(make_settings, site: ScriptedConfluence, **confluence):  # type: ignore[no-untyped-def]
    return make_settings(
        knowledge={"confluence": {"base_url": site.base_url, "token": ORG, **confluence}},
        companies={
            "acme": {
                "roles": {
                    "sre": {"knowledge_containers": ["OPS"], "workspaces": ["payments"], "unit": "platform"},
                    "intern": {},
                },
                "knowledge": {
                    "scope": ["ENG"],
                    "seat_credentials": {"ana": ANA},
                    "unit_containers": {"platform": "PLAT"},
                },
            },
            "globex": {
                "roles": {"intern": {}, "dev": {"workspaces": ["proj"]}},
                "knowledge": {"seat_credentials": {"zed": "zed-token"}},
            },
        },
    )


@dataclass
class Env:
    app: App
    site: ScriptedConfluence
    stub: pb_grpc.KnowledgeServiceStub

    @property
    def service(self):  # type: ignore[no-untyped-def]
        return self.app.components["knowledge"].service

    async def search(self, query: str, seat: str = "ana", role: str = "sre", company: str = "acme", limit: int = 0):
        return await self.stub.SearchPages(
            pb.SearchPagesRequest(reader=pb.Reader(company=company, seat=seat, role=role), query=query, limit=limit)
        )

    def searches(self) -> list:
        return self.site.received("/rest/api/search")


@contextlib.asynccontextmanager
async def open_env(settings, site, dsn, clock, index, names=("knowledge",), auth_mode="local"):  # type: ignore[no-untyped-def]
    async with open_app(
        settings, dsn, names=list(names), clock=clock, embedder=None, index=index, auth_mode=auth_mode
    ) as app:
        try:
            yield Env(app, site, pb_grpc.KnowledgeServiceStub(app.channel))
        finally:
            await app.components["knowledge"].service.backend.primary.client.close()


@pytest.fixture
async def env(make_settings, site, dsn, clock, edge_index):
    async with open_env(settings_for(make_settings, site), site, dsn, clock, edge_index) as e:
        yield e


def clause(rec, name: str) -> Clause | None:  # type: ignore[no-untyped-def]
    return next((c for c in rec.cql.clauses if c.field == name), None)


# ------------------------------------------------------------------------------------- search


async def test_confluence_is_the_backend_when_it_has_a_site(env):
    assert isinstance(env.service.backend, RoutedBackend)
    assert isinstance(env.service.backend.primary, ConfluenceBackend)


async def test_search_runs_cql_as_the_seat_narrowed_by_spaces_and_never_shows_a_draft(env):
    site = env.site
    site.page("ENG", "Deploy runbook", "Deploy with make ship, then watch the dashboards.")
    site.page("OPS", "Deploy checklist", "Before you deploy: freeze, tag, announce.")
    site.page("SECRET", "Deploy secrets", "Where the deploy keys live.")  # ana may not read it
    site.page("MISC", "Deploy trivia", "Ana may read MISC, but it is in no container of hers.")
    drafts = site.page("ENG", AUTO_DRAFTED_PARENT, "Drafts.")
    site.page("ENG", "Deploy draft", "Deploy by hand.", parent=drafts)
    lower = site.page("OPS", "auto-drafted skills ", "A parent typed in lower case.")
    site.page("OPS", "Nested deploy draft", "Deploy nested.", parent=lower)
    site.page("ENG", "[Auto-draft] Deploy steps", "Deploy by the backstop.")

    resp = await env.search("deploy")
    assert resp.served_mode == pb.SERVED_MODE_CONFLUENCE and not resp.unsearched_reason
    assert sorted(h.title for h in resp.hits) == ["Deploy checklist", "Deploy runbook"]
    assert {h.container for h in resp.hits} == {"ENG", "OPS"}
    assert "deploy" in next(h for h in resp.hits if h.title == "Deploy runbook").snippet.lower()

    [search] = env.searches()
    assert search.authorization == basic(ANA)  # as the seat's own user
    assert clause(search, "text") == Clause("text", "~", "deploy")
    assert clause(search, "space") == Clause("space", "in", ("ENG", "OPS"))  # knowledge.scope, then the role's
    assert clause(search, "ancestor") == Clause("ancestor", "not in", (drafts,))  # the query's own exclusion
    # The lower-case parent and the [Auto-draft] title slipped past the query; this side dropped them.
    [lookup] = site.received("/rest/api/content/search")
    assert clause(lookup, "title") == Clause("title", "=", AUTO_DRAFTED_PARENT)

    [read] = [dict(e) for e in await read_events(env.app.infra.pool, "knowledge_read")]
    assert read["seat"] == "ana" and read["payload"]["source"] == "search_pages"
    assert {p["title"] for p in read["payload"]["pages"]} == {"Deploy checklist", "Deploy runbook"}


async def test_a_seat_without_its_own_credential_reads_as_the_org_token_and_one_with_one_may_search_unscoped(env):
    site = env.site
    site.page("ENG", "Billing export", "Run the billing export.")
    site.page("ZED", "Billing at globex", "Globex billing.")
    site.page("OTHER", "Billing elsewhere", "Someone else's billing.")

    bob = await env.search("billing", seat="bob")
    assert [h.title for h in bob.hits] == ["Billing export"]
    assert env.searches()[-1].authorization == f"Bearer {ORG}"

    # zed has a credential of its own and no container: an unscoped search as zed, where
    # Confluence's own permissions decide what it sees.
    can = await env.stub.CanSearch(pb.CanSearchRequest(reader=pb.Reader(company="globex", seat="zed", role="intern")))
    assert can.can_search and can.unscoped and not can.containers
    zed = await env.search("billing", seat="zed", role="intern", company="globex")
    assert [h.title for h in zed.hits] == ["Billing at globex"]
    assert clause(env.searches()[-1], "space") is None and env.searches()[-1].authorization == "Bearer zed-token"

    # A seat with neither a container nor a credential of its own cannot search at all.
    yan = pb.Reader(company="globex", seat="yan", role="intern")
    assert not (await env.stub.CanSearch(pb.CanSearchRequest(reader=yan))).can_search
    nothing = await env.search("billing", seat="yan", role="intern", company="globex")
    assert nothing.unsearched_reason == pb.UNSEARCHED_REASON_SCOPED_TO_NOTHING and not nothing.served_mode


async def test_the_query_cannot_break_out_of_its_cql_string(env):
    site = env.site
    site.page("ENG", "Billing export", "Billing export steps.")
    site.page("SECRET", "Billing secrets", "Secret billing.")
    resp = await env.search('billing" OR space = "SECRET" OR text ~ "\\')
    assert [h.title for h in resp.hits] == ["Billing export"]
    search = env.searches()[-1]
    assert search.cql is not None  # it parsed: one string, nothing injected
    assert [c.field for c in search.cql.clauses] == ["type", "text", "space"]
    assert clause(search, "space") == Clause("space", "in", ("ENG", "OPS"))
    assert clause(search, "text").value == "billing OR space = SECRET OR text"
    # What escaping does on its own (titles and parents go through it verbatim).
    tricky = 'Ops "quoted" \\ back'
    assert parse_cql(f"title = {cql_string(tricky)}").clauses == (Clause("title", "=", tricky),)
    assert search_terms('a*b? "c" (d) [e] ~f') == "a b c d e f"


async def test_results_are_paged_by_links_next(make_settings, dsn, clock, edge_index):
    site = ScriptedConfluence(max_limit=2).start()
    site.add_user(ORG, "bot")
    site.add_user(ANA, "ana", {"ENG", "OPS"})
    try:
        async with open_env(settings_for(make_settings, site, page_size=10), site, dsn, clock, edge_index) as env:
            for i in range(5):
                site.page("ENG", f"Kafka note {i}", f"Kafka broker note {i}.")
            drafts = site.page("ENG", AUTO_DRAFTED_PARENT, "Drafts.")
            site.page("ENG", "Kafka draft", "Kafka drafted.", parent=drafts)
            resp = await env.search("kafka", limit=4)
            assert [h.title for h in resp.hits] == [f"Kafka note {i}" for i in range(4)]
            starts = [int(r.params["start"]) for r in env.searches()]
            assert starts == [0, 2]  # the server capped each page at 2; the client followed _links.next

            # ListPages pages too, through signed page tokens carrying Confluence's offset.
            titles, token = [], ""
            reader = pb.Reader(company="acme", seat="ana", role="sre")
            while True:
                page = await env.stub.ListPages(
                    pb.ListPagesRequest(reader=reader, container="ENG", page_size=2, page_token=token)
                )
                titles += [p.title for p in page.pages]
                token = page.next_page_token
                if not token:
                    break
            assert titles == [f"Kafka note {i}" for i in range(5)]  # drafts never listed to a seat
    finally:
        site.stop()


# ------------------------------------------------------------------------------------- failures


async def test_a_refused_credential_is_an_outcome_that_says_whose(env):
    env.site.page("ENG", "Deploy runbook", "Deploy.")
    env.site.push(Reply(401, {"message": "Unauthorized"}))
    resp = await env.search("deploy")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_CREDENTIAL_REFUSED and not resp.served_mode
    assert "seat ana" in resp.detail and "401" in resp.detail and not resp.hits

    env.site.push(Reply(403, {"message": "Forbidden"}))
    resp = await env.search("deploy", seat="bob")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_CREDENTIAL_REFUSED
    assert "org token" in resp.detail and "403" in resp.detail

    # A read by id whose credential is refused is FAILED_PRECONDITION (an operator's to fix).
    env.site.push(Reply(401))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.stub.GetPage(pb.GetPageRequest(reader=pb.Reader(company="acme", seat="ana", role="sre"), page_id="1"))
    code, info, _ = error_info(err.value)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "KNOWLEDGE_CREDENTIAL_REFUSED"


async def test_search_knowledge_says_the_search_did_not_run_and_why(make_settings, site, dsn, clock, edge_index):
    async with open_env(
        settings_for(make_settings, site), site, dsn, clock, edge_index, names=("knowledge", "prefetch")
    ) as env:
        site.page("ENG", "Deploy runbook", "Deploy.")
        builtins = ppb_grpc.BuiltinServiceStub(env.app.channel)
        site.push(Reply(401))
        answer = await builtins.SearchKnowledge(
            ppb.SearchKnowledgeRequest(company="acme", seat="ana", role="sre", query="deploy", turn_id="t1")
        )
        assert answer.status == ppb.SEARCH_STATUS_CREDENTIAL_REFUSED
        assert "refused the credential" in answer.text and "seat ana" in answer.text and "did not run" in answer.text
        site.push(Reply(429, headers={"Retry-After": "600"}))
        answer = await builtins.SearchKnowledge(
            ppb.SearchKnowledgeRequest(company="acme", seat="ana", role="sre", query="deploy", turn_id="t1")
        )
        assert answer.status == ppb.SEARCH_STATUS_RATE_LIMITED and "600 s" in answer.text


async def test_a_rate_limit_is_waited_out_within_bounds_and_otherwise_said(env):
    env.site.page("ENG", "Deploy runbook", "Deploy.")
    env.site.push(Reply(429, {"message": "slow down"}, {"Retry-After": "0"}))
    resp = await env.search("deploy")
    assert [h.title for h in resp.hits] == ["Deploy runbook"]
    statuses = [r.status for r in env.site.received()]
    assert statuses == [429, 200, 200]  # the parent lookup was retried once, then the search ran

    before = len(env.site.received())
    env.site.push(Reply(429, headers={"Retry-After": "120"}))  # past max_retry_after_seconds (5)
    resp = await env.search("deploy")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_RATE_LIMITED and "120 s" in resp.detail
    assert len(env.site.received()) == before + 1  # not waited for: the turn is not held

    before = len(env.site.received())
    env.site.push(*[Reply(429, headers={"Retry-After": "0"})] * 3)  # max_retries is 2
    resp = await env.search("deploy")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_RATE_LIMITED
    assert len(env.site.received()) == before + 3


async def test_an_unreachable_site_is_unreachable_not_empty(make_settings, dsn, clock, edge_index):
    site = ScriptedConfluence().start()
    settings = settings_for(make_settings, site)
    site.stop()  # nothing listens there any more
    async with open_env(settings, site, dsn, clock, edge_index) as env:
        resp = await env.search("deploy")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_UNREACHABLE and "could not be reached" in resp.detail


async def test_an_operators_search_needs_the_inspect_scope_and_a_company_wide_credential(
    make_settings, site, dsn, clock, edge_index
):
    """Naming no seat and no role is an operator's read, which on Confluence searches every space
    as the org token: a token bound to a seat (or without inspect) is refused before Confluence
    is asked — SearchPages, CanSearch and the onboarding read alike, as GetPage and ListPages."""
    site.page("HR", "Salaries 2026", "Everyone's salaries.")
    site.page("PLAT", "Onboarding", "Start here.")
    async with open_env(settings_for(make_settings, site), site, dsn, clock, edge_index, auth_mode="tokens") as env:
        tokens = env.app.infra.tokens
        seat_read, _ = await tokens.issue("acme", ["memory:read"], seat="ana")
        seat_inspect, _ = await tokens.issue("acme", ["memory:read", "inspect"], seat="ana")
        inspector, _ = await tokens.issue("acme", ["memory:read", "inspect"])
        operator = pb.Reader(company="acme")

        def calls(token: str):  # type: ignore[no-untyped-def]
            metadata = (("authorization", f"Bearer {token}"),)
            return [
                env.stub.SearchPages(pb.SearchPagesRequest(reader=operator, query="salaries"), metadata=metadata),
                env.stub.CanSearch(pb.CanSearchRequest(reader=operator), metadata=metadata),
                env.stub.ListOnboardingPages(
                    pb.ListOnboardingPagesRequest(reader=operator, unit_chain=["platform"]), metadata=metadata
                ),
            ]

        for token, reason in ((seat_read, "SCOPE_MISSING"), (seat_inspect, "COMPANY_WIDE_CREDENTIAL_REQUIRED")):
            for call in calls(token):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                code, info, _ = error_info(err.value)
                assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, reason)
        assert site.received() == []  # Confluence was never asked
        assert await read_events(env.app.infra.pool, "knowledge_read") == []

        # A credential bound to the company alone, with inspect, keeps the operator's search.
        found = await env.stub.SearchPages(
            pb.SearchPagesRequest(reader=operator, query="salaries"),
            metadata=(("authorization", f"Bearer {inspector}"),),
        )
        assert [h.title for h in found.hits] == ["Salaries 2026"]


# ------------------------------------------------------------------------------------- reads


async def test_get_page_is_scoped_like_search(env):
    site = env.site
    ok = site.page("ENG", "Deploy runbook", "<h2>Steps</h2><ul><li>make ship</li><li>watch</li></ul>")
    secret = site.page("SECRET", "Deploy secrets", "Keys.")
    misc = site.page("MISC", "Trivia", "Ana's user may read it; no container of hers names it.")
    drafts = site.page("ENG", AUTO_DRAFTED_PARENT, "Drafts.")
    draft = site.page("ENG", "Deploy draft", "Deploy by hand.", parent=drafts)
    ana = pb.Reader(company="acme", seat="ana", role="sre")

    page = (await env.stub.GetPage(pb.GetPageRequest(reader=ana, page_id=ok))).page
    assert (page.title, page.container, page.backend) == ("Deploy runbook", "ENG", pb.SERVED_MODE_CONFLUENCE)
    assert page.body == "## Steps\n\n- make ship\n- watch"
    assert site.received(f"/rest/api/content/{ok}")[-1].authorization == basic(ANA)

    for pid in (secret, misc, draft, drafts, "999999"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.stub.GetPage(pb.GetPageRequest(reader=ana, page_id=pid))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, pid

    # An operator (the local principal has every scope) reads the draft, marked as one.
    seen = (await env.stub.GetPage(pb.GetPageRequest(reader=pb.Reader(company="acme"), page_id=draft))).page
    assert seen.draft and list(seen.parent_titles) == [AUTO_DRAFTED_PARENT]

    # The inspector's listing of drafts waiting for a lead.
    waiting = await env.stub.ListPages(
        pb.ListPagesRequest(
            reader=pb.Reader(company="acme"), container="ENG", parent_title=AUTO_DRAFTED_PARENT, include_drafts=True
        )
    )
    assert [p.title for p in waiting.pages] == ["Deploy draft"]


async def test_a_parent_title_is_escaped_in_the_listing(env):
    site = env.site
    parent = site.page("ENG", 'Runbooks "2026" \\ ops', "Parent.")
    site.page("ENG", "Child one", "One.", parent=parent)
    site.page("ENG", "Elsewhere", "Not a child.")
    resp = await env.stub.ListPages(
        pb.ListPagesRequest(
            reader=pb.Reader(company="acme", seat="ana", role="sre"),
            container="ENG",
            parent_title='Runbooks "2026" \\ ops',
            view=pb.PAGE_VIEW_FULL,
        )
    )
    assert [(p.title, p.body) for p in resp.pages] == [("Child one", "One.")]


async def test_onboarding_pages_come_from_the_units_space(env):
    site = env.site
    root = site.page("PLAT", "Onboarding", "Start here.")
    site.page("PLAT", "First deploy", "Deploy hello world.", parent=root)
    site.page("PLAT", "Runbook", "Not onboarding.")
    resp = await env.stub.ListOnboardingPages(
        pb.ListOnboardingPagesRequest(reader=pb.Reader(company="acme", seat="bob", role="sre"), unit_chain=["platform"])
    )
    assert [(h.container, h.title) for h in resp.pages] == [("PLAT", "Onboarding"), ("PLAT", "First deploy")]
    assert resp.served_mode == pb.SERVED_MODE_CONFLUENCE


# ------------------------------------------------------------------------------------- drafts


def draft(title: str = "Team routine: vault_read → deploy (abc12345)", space: str = "PLAT") -> PromotionDraft:
    return PromotionDraft(
        company="acme",
        unit="platform",
        container_key=space,
        title=title,
        body="Rotate keys safely.\n\n## Steps\n\n1. Call `vault_read`.\n2. Call `deploy`.\n\n- **never** skip",
        tool_sequence=("vault_read", "deploy"),
        sibling_count=5,
        distinct_agents=3,
    )


async def test_a_draft_is_posted_as_storage_xhtml_under_the_parent_it_creates_once(env):
    writer = env.service.backend
    first = await writer.write_draft(draft())
    assert first.created
    parent = env.site.titled("PLAT", AUTO_DRAFTED_PARENT)
    page = env.site.pages[first.page_id]
    assert parent is not None and parent.parent is None and page.parent == parent.id
    assert page.body == (
        "<p>Rotate keys safely.</p><h2>Steps</h2><ol><li>Call <code>vault_read</code>.</li>"
        "<li>Call <code>deploy</code>.</li></ol><ul><li><strong>never</strong> skip</li></ul>"
    )
    posts = [r for r in env.site.received("/rest/api/content") if r.method == "POST"]
    assert [p.body["title"] for p in posts] == [AUTO_DRAFTED_PARENT, draft().title]
    assert all(p.authorization == f"Bearer {ORG}" for p in posts)

    again = await writer.write_draft(draft())
    assert not again.created and again.page_id == first.page_id
    assert len([r for r in env.site.received("/rest/api/content") if r.method == "POST"]) == 2  # nothing posted


async def test_a_draft_is_refused_rather_than_filed_at_the_space_root(make_settings, dsn, clock, edge_index):
    site = ScriptedConfluence().start()
    site.add_user(ORG, "read-only bot", writes=False)
    try:
        async with open_env(settings_for(make_settings, site), site, dsn, clock, edge_index) as env:
            with pytest.raises(PromotionRefused, match="not filed at the space root"):
                await env.service.backend.write_draft(draft())
            assert site.pages == {}
    finally:
        site.stop()


def test_storage_round_trip_keeps_the_text():
    md = "# Title\n\nA paragraph with `code` & <tags>.\n\n- one\n- two"
    assert storage_to_text(render_storage(md)) == "# Title\n\nA paragraph with code & <tags>.\n\n- one\n- two"


# ------------------------------------------------------------------------------------- routed


async def test_workspace_lessons_stay_native_and_are_searched_beside_confluence(env):
    env.site.page("ENG", "Migration runbook", "Run the migration with make migrate.")
    await env.stub.UpsertPage(
        pb.UpsertPageRequest(
            company="acme", container="workspace:payments", title="Lesson: migrate first", body="Run migrate first."
        )
    )
    resp = await env.search("migrate migration")
    assert resp.served_mode == pb.SERVED_MODE_CONFLUENCE
    assert sorted((h.container, h.title) for h in resp.hits) == [
        ("ENG", "Migration runbook"),
        ("workspace:payments", "Lesson: migrate first"),
    ]
    # Confluence's half did not run: the whole search did not (a partial answer would claim
    # "nothing matched" about pages it never saw).
    env.site.push(Reply(500, {"message": "boom"}))
    resp = await env.search("migrate migration")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_UNREACHABLE and not resp.hits


async def test_a_seat_with_its_own_credential_and_only_workspaces_is_not_searched_unscoped(env):
    """zed has a credential of its own and, as dev, only workspace:proj: no Confluence space at all.
    Its search is the native lessons of the workspace, never an unscoped search of every space
    zed's user can see (CanSearch says it is not unscoped; a page found so would be NOT_FOUND)."""
    env.site.page("ZED", "Billing at globex", "Globex billing.")
    await env.stub.UpsertPage(
        pb.UpsertPageRequest(company="globex", container="workspace:proj", title="Lesson: billing", body="Billing.")
    )
    zed = pb.Reader(company="globex", seat="zed", role="dev")
    can = await env.stub.CanSearch(pb.CanSearchRequest(reader=zed))
    assert can.can_search and not can.unscoped and list(can.containers) == ["workspace:proj"]
    resp = await env.search("billing", seat="zed", role="dev", company="globex")
    assert resp.served_mode == pb.SERVED_MODE_NATIVE
    assert [(h.container, h.title) for h in resp.hits] == [("workspace:proj", "Lesson: billing")]
    assert env.searches() == []  # Confluence was not searched at all


async def test_a_listing_of_spaces_and_workspaces_lists_both(env):
    """ana (sre) reads ENG and OPS on Confluence and workspace:payments natively. A ListPages naming
    no container lists Confluence's spaces first, then the workspace's lessons, paged across the
    two by one page token; no workspace name is sent to Confluence as a space key."""
    site = env.site
    for space, title in (("ENG", "Deploy runbook"), ("ENG", "Release notes"), ("OPS", "Pager rota")):
        site.page(space, title, "Text.")
    for title in ("Lesson: migrate first", "Lesson: tag releases"):
        await env.stub.UpsertPage(
            pb.UpsertPageRequest(company="acme", container="workspace:payments", title=title, body="Do it.")
        )
    ana = pb.Reader(company="acme", seat="ana", role="sre")
    pages, token, requests = [], "", 0
    while True:
        resp = await env.stub.ListPages(pb.ListPagesRequest(reader=ana, page_size=2, page_token=token))
        requests += 1
        assert len(resp.pages) <= 2
        pages += [(p.container, p.title) for p in resp.pages]
        token = resp.next_page_token
        if not token:
            break
    assert pages == [
        ("ENG", "Deploy runbook"),
        ("OPS", "Pager rota"),
        ("ENG", "Release notes"),
        ("workspace:payments", "Lesson: migrate first"),
        ("workspace:payments", "Lesson: tag releases"),
    ]
    assert requests == 3
    listings = site.received("/rest/api/content/search")
    assert {clause(r, "space").value for r in listings if clause(r, "parent") is None} == {("ENG", "OPS")}  # type: ignore[union-attr]


async def test_confluences_own_error_message_is_not_repeated_or_logged(env, caplog):
    """Confluence's error message echoes the request — the CQL written from a person's ask, a
    page's title — and the unsearched detail is logged, where no erasure reaches: only the status
    is said."""
    env.site.page("ENG", "Deploy runbook", "Deploy.")
    env.site.push(Reply(400, {"message": 'Could not parse cql: text ~ "carla zyxmoreno salary"'}))
    with caplog.at_level(logging.DEBUG):
        resp = await env.search("carla zyxmoreno salary")
    assert resp.unsearched_reason == pb.UNSEARCHED_REASON_UNREACHABLE and not resp.hits
    assert "HTTP 400" in resp.detail
    assert "zyxmoreno" not in resp.detail
    assert not [r for r in caplog.records if "zyxmoreno" in r.getMessage()]
