"""Who reads what in the knowledge service (native backend, real gRPC, real Postgres, real tokens):
the company's knowledge.scope for every seat, the role's and the seat's own containers, GetPage
and ListPages scoped like search (a draft or a page outside the scope is NOT_FOUND to a seat),
operators' reads behind the inspect scope (the deprecated alias's GetPage included), listings by
container and parent title with page tokens, and a knowledge_read for every read that reached
pages."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.knowledge.v1 import knowledge_service_pb2 as pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as pb_grpc
from agentlearn.prefetch.v1 import knowledge_service_pb2 as legacy_pb
from agentlearn.prefetch.v1 import knowledge_service_pb2_grpc as legacy_grpc
from libs.common.auth import INTERNAL_HEADER
from libs.common.events import read_events
from services.knowledge.domain import AUTO_DRAFTED_PARENT
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

SETTINGS = {
    "companies": {
        "acme": {
            "roles": {"sre": {"knowledge_containers": ["ops"]}, "intern": {}},
            "knowledge": {"scope": ["handbook"], "seat_containers": {"ana": ["ana-notes"]}},
        }
    }
}


@pytest.fixture
async def app(make_settings, dsn, clock, edge_index):
    async with open_app(
        make_settings(**SETTINGS), dsn, names=["knowledge"], clock=clock, embedder=None, index=edge_index
    ) as a:
        yield a


@pytest.fixture
async def tokens_app(make_settings, dsn, clock, edge_index):
    async with open_app(
        make_settings(**SETTINGS),
        dsn,
        names=["knowledge"],
        clock=clock,
        embedder=None,
        index=edge_index,
        auth_mode="tokens",
    ) as a:
        yield a


def reader(seat: str = "", role: str = "", company: str = "acme") -> pb.Reader:
    return pb.Reader(company=company, seat=seat, role=role)


async def put(stub, container: str, title: str, body: str = "Deploy notes.", parents=(), metadata=None) -> str:  # type: ignore[no-untyped-def]
    resp = await stub.UpsertPage(
        pb.UpsertPageRequest(company="acme", container=container, title=title, body=body, parent_titles=list(parents)),
        metadata=metadata,
    )
    return resp.page.id


async def titles(stub, seat: str, role: str, query: str = "deploy") -> list[str]:  # type: ignore[no-untyped-def]
    resp = await stub.SearchPages(pb.SearchPagesRequest(reader=reader(seat, role), query=query, limit=20))
    assert resp.served_mode == pb.SERVED_MODE_NATIVE, resp
    return sorted(h.title for h in resp.hits)


async def test_the_company_scope_the_role_and_the_seat_make_a_readers_containers(app):
    stub = pb_grpc.KnowledgeServiceStub(app.channel)
    for container in ("handbook", "ops", "ana-notes", "docs"):
        await put(stub, container, f"Deploy in {container}")
    assert await titles(stub, "ana", "sre") == ["Deploy in ana-notes", "Deploy in handbook", "Deploy in ops"]
    assert await titles(stub, "bob", "sre") == ["Deploy in handbook", "Deploy in ops"]
    assert await titles(stub, "ana", "intern") == ["Deploy in ana-notes", "Deploy in handbook"]
    # knowledge.scope is every seat's, whatever its role says (an unknown role adds nothing more).
    assert await titles(stub, "bob", "ghost") == ["Deploy in handbook"]
    can = await stub.CanSearch(pb.CanSearchRequest(reader=reader("ana", "sre")))
    assert list(can.containers) == ["handbook", "ops", "ana-notes"] and can.can_search and not can.unscoped
    other = await stub.CanSearch(pb.CanSearchRequest(reader=reader("bob", "sre", company="globex")))
    assert not other.can_search and not other.containers


async def test_get_page_is_not_found_to_a_seat_outside_its_scope_or_under_the_drafts(app):
    stub = pb_grpc.KnowledgeServiceStub(app.channel)
    readable = await put(stub, "ops", "Deploy runbook")
    hidden = {
        "another container": await put(stub, "docs", "Docs deploy"),
        "a draft": await put(stub, "ops", "Deploy draft", parents=[AUTO_DRAFTED_PARENT]),
        "the drafts' parent": await put(stub, "ops", AUTO_DRAFTED_PARENT),
        "an [Auto-draft] title": await put(stub, "ops", "[Auto-draft] Deploy steps"),
        "another seat's container": await put(stub, "ana-notes", "Ana's deploy notes"),
    }
    got = await stub.GetPage(pb.GetPageRequest(reader=reader("bob", "sre"), page_id=readable))
    assert got.page.title == "Deploy runbook" and not got.page.draft

    async def refusal(page_id: str):  # type: ignore[no-untyped-def]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetPage(pb.GetPageRequest(reader=reader("bob", "sre"), page_id=page_id))
        code, info, _ = error_info(err.value)
        return code, info.reason, err.value.details().replace(page_id, "<id>")

    nowhere = await refusal("00000000-0000-0000-0000-000000000000")
    assert nowhere[:2] == (grpc.StatusCode.NOT_FOUND, "PAGE_NOT_FOUND")
    for what, page_id in hidden.items():
        # Indistinguishable from a page that does not exist.
        assert await refusal(page_id) == nowhere, what

    # The operator (no seat, no role; local mode has every scope) reads every page, drafts marked.
    draft = (await stub.GetPage(pb.GetPageRequest(reader=reader(), page_id=hidden["a draft"]))).page
    assert draft.draft and list(draft.parent_titles) == [AUTO_DRAFTED_PARENT]


async def test_an_operators_read_needs_the_inspect_scope(tokens_app):
    app = tokens_app
    internal = ((INTERNAL_HEADER, app.infra.internal_secret),)
    stub = pb_grpc.KnowledgeServiceStub(app.channel)
    legacy = legacy_grpc.KnowledgeServiceStub(app.channel)
    draft = await put(stub, "ops", "Deploy draft", parents=[AUTO_DRAFTED_PARENT], metadata=internal)
    page = await put(stub, "ops", "Deploy runbook", metadata=internal)

    seat_token, _ = await app.infra.tokens.issue("acme", ["memory:read"], seat="bob")
    inspector, _ = await app.infra.tokens.issue("acme", ["memory:read", "inspect"])
    as_seat = (("authorization", f"Bearer {seat_token}"),)
    as_inspector = (("authorization", f"Bearer {inspector}"),)

    # The seat reads as itself.
    ok = await stub.GetPage(pb.GetPageRequest(reader=reader("bob", "sre"), page_id=page), metadata=as_seat)
    assert ok.page.title == "Deploy runbook"
    # Naming no seat and no role is an operator's read: refused without inspect, on the alias too
    # (which used to hand any memory:read caller the drafts).
    for call in (
        stub.GetPage(pb.GetPageRequest(reader=reader(), page_id=draft), metadata=as_seat),
        legacy.GetPage(legacy_pb.GetPageRequest(company="acme", page_id=draft), metadata=as_seat),
        stub.ListPages(pb.ListPagesRequest(reader=reader(), container="ops"), metadata=as_seat),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        code, info, _ = error_info(err.value)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert (info.reason, info.metadata["scope"]) == ("SCOPE_MISSING", "inspect")
    # Another seat than the token's is refused before anything is read.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPage(pb.GetPageRequest(reader=reader("ana", "sre"), page_id=page), metadata=as_seat)
    assert error_info(err.value)[1].reason == "CREDENTIAL_SCOPE_MISMATCH"
    # A seat may not ask for drafts at all.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListPages(
            pb.ListPagesRequest(reader=reader("bob", "sre"), container="ops", include_drafts=True), metadata=as_seat
        )
    assert error_info(err.value)[1].reason == "DRAFTS_OPERATOR_ONLY"

    # With inspect: every page, drafts included, here and on the alias.
    seen = await stub.GetPage(pb.GetPageRequest(reader=reader(), page_id=draft), metadata=as_inspector)
    assert seen.page.draft
    aliased = await legacy.GetPage(legacy_pb.GetPageRequest(company="acme", page_id=draft), metadata=as_inspector)
    assert aliased.page.title == "Deploy draft"


async def test_a_token_bound_to_a_seat_reads_no_operator_view_and_no_drafts_provenance(tokens_app):
    """Inspect and memory:read on a token bound to seat bob: its own seat's read as ever, but naming
    no seat and no role (an operator's read: every page, drafts included) and a draft's provenance
    (the runs of every seat it was promoted from) are refused, naming the binding."""
    app = tokens_app
    internal = ((INTERNAL_HEADER, app.infra.internal_secret),)
    stub = pb_grpc.KnowledgeServiceStub(app.channel)
    legacy = legacy_grpc.KnowledgeServiceStub(app.channel)
    draft = await put(stub, "ops", "Deploy draft", parents=[AUTO_DRAFTED_PARENT], metadata=internal)
    page = await put(stub, "ops", "Deploy runbook", metadata=internal)
    promoted = await stub.WritePromotionDraft(
        pb.WritePromotionDraftRequest(
            company="acme",
            unit="platform",
            container_key="ops",
            title="Team routine: deploys",
            body="1. Freeze merges.",
            sources=[pb.DraftSource(seat="ana", turn_id="run-1"), pb.DraftSource(seat="cy", turn_id="run-2")],
        ),
        metadata=internal,
    )
    seat_token, _ = await app.infra.tokens.issue("acme", ["memory:read", "inspect"], seat="bob")
    user_token, _ = await app.infra.tokens.issue("acme", ["memory:read", "inspect"], user="carla")
    company_token, _ = await app.infra.tokens.issue("acme", ["memory:read", "inspect"])
    as_seat = (("authorization", f"Bearer {seat_token}"),)

    ok = await stub.GetPage(pb.GetPageRequest(reader=reader("bob", "sre"), page_id=page), metadata=as_seat)
    assert ok.page.title == "Deploy runbook"
    for bound, token in (("bound_seat", seat_token), ("bound_user", user_token)):
        metadata = (("authorization", f"Bearer {token}"),)
        for call in (
            stub.ListPages(
                pb.ListPagesRequest(reader=reader(), include_drafts=True, view=pb.PAGE_VIEW_FULL), metadata=metadata
            ),
            stub.GetPage(pb.GetPageRequest(reader=reader(), page_id=draft), metadata=metadata),
            legacy.GetPage(legacy_pb.GetPageRequest(company="acme", page_id=draft), metadata=metadata),
            stub.GetDraftProvenance(
                pb.GetDraftProvenanceRequest(company="acme", page_id=promoted.page_id), metadata=metadata
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            code, info, _ = error_info(err.value)
            assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "COMPANY_WIDE_CREDENTIAL_REQUIRED")
            assert info.metadata[bound] in ("bob", "carla") and "bound to" in err.value.details()
    # A token bound to the company alone keeps the operator's view.
    as_company = (("authorization", f"Bearer {company_token}"),)
    listed = await stub.ListPages(pb.ListPagesRequest(reader=reader(), include_drafts=True), metadata=as_company)
    assert "Deploy draft" in [p.title for p in listed.pages]
    origin = await stub.GetDraftProvenance(
        pb.GetDraftProvenanceRequest(company="acme", page_id=promoted.page_id), metadata=as_company
    )
    assert list(origin.seats) == ["ana", "cy"]


async def test_list_pages_by_container_and_parent_title_paged(app):
    stub = pb_grpc.KnowledgeServiceStub(app.channel)
    for i in range(5):
        await put(stub, "ops", f"Runbook {i}", body=f"Body {i}.", parents=["Runbooks"])
    await put(stub, "ops", "Runbooks", body="Index.")
    await put(stub, "ops", "Grandchild", body="Deeper.", parents=["Runbooks", "Runbook 1"])
    await put(stub, "ops", "Draft runbook", parents=[AUTO_DRAFTED_PARENT])
    await put(stub, "ops", AUTO_DRAFTED_PARENT)
    await put(stub, "docs", "Docs page")

    bob = reader("bob", "sre")
    seen, token = [], ""
    while True:
        resp = await stub.ListPages(
            pb.ListPagesRequest(reader=bob, container="ops", parent_title="Runbooks", page_size=2, page_token=token)
        )
        assert len(resp.pages) <= 2 and all(p.body == "" for p in resp.pages)  # BASIC: no bodies
        seen += [p.title for p in resp.pages]
        token = resp.next_page_token
        if not token:
            break
    assert seen == [f"Runbook {i}" for i in range(5)]  # direct children only, in title order

    everything = await stub.ListPages(pb.ListPagesRequest(reader=bob, view=pb.PAGE_VIEW_FULL))
    assert [p.title for p in everything.pages] == ["Grandchild", *[f"Runbook {i}" for i in range(5)], "Runbooks"]
    assert everything.pages[1].body == "Body 0."
    # A container the reader may not read lists as nothing, like a page it may not read.
    assert not (await stub.ListPages(pb.ListPagesRequest(reader=bob, container="docs"))).pages

    # The inspector's view: the drafts waiting for a lead.
    waiting = await stub.ListPages(
        pb.ListPagesRequest(reader=reader(), container="ops", parent_title=AUTO_DRAFTED_PARENT, include_drafts=True)
    )
    assert [(p.title, p.draft) for p in waiting.pages] == [("Draft runbook", True)]

    # A page token belongs to its filters.
    first = await stub.ListPages(pb.ListPagesRequest(reader=bob, container="ops", page_size=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListPages(pb.ListPagesRequest(reader=bob, container="docs", page_token=first.next_page_token))
    assert error_info(err.value)[1].reason == "PAGE_TOKEN_INVALID"


async def test_every_read_that_reached_pages_records_knowledge_read(app):
    stub = pb_grpc.KnowledgeServiceStub(app.channel)
    page = await put(stub, "ops", "Deploy runbook")

    async def reads() -> list[dict]:
        return [dict(e) for e in await read_events(app.infra.pool, "knowledge_read")]

    await stub.GetPage(pb.GetPageRequest(reader=reader("bob", "sre"), page_id=page))
    await stub.ListPages(pb.ListPagesRequest(reader=reader("bob", "sre"), container="ops"))
    await stub.SearchPages(
        pb.SearchPagesRequest(
            reader=reader("bob", "sre"),
            query="deploy",
            context=pb.ReadContext(source=pb.READ_SOURCE_SEARCH_KNOWLEDGE, turn_id="run-7"),
        )
    )
    named = [{"page_id": page, "title": "Deploy runbook", "container": "ops"}]
    got = await reads()
    assert [(r["payload"]["source"], r["seat"], r["payload"]["pages"]) for r in got] == [
        ("get_page", "bob", named),
        ("list_pages", "bob", named),
        ("search_knowledge", "bob", named),
    ]
    assert got[2]["turn_id"] == "run-7" and got[2]["payload"]["query"] == "deploy"

    # Reads that reached nothing name nothing, and record nothing.
    await stub.SearchPages(pb.SearchPagesRequest(reader=reader("bob", "sre"), query="telescope"))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetPage(pb.GetPageRequest(reader=reader("bob", "intern"), page_id=page))
    assert len(await reads()) == 3
