"""The knowledge service's native backend: UpsertPage / GetPage over real gRPC, and the search
against real PostgreSQL, the real local embedding model and real index adapters — scoping by the
reader's containers, both auto-draft exclusions, snippets, the vector ∪ lexical merge, the exact
scan when the index is down, "unreachable" when the store cannot be read, CanSearch without I/O,
the fill, the native promotion writer, and the deprecated prefetch.v1 alias."""

from __future__ import annotations

import contextlib
import types
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from agentlearn.knowledge.v1 import knowledge_service_pb2 as pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as pb_grpc
from agentlearn.prefetch.v1 import knowledge_service_pb2 as legacy_pb
from agentlearn.prefetch.v1 import knowledge_service_pb2_grpc as legacy_grpc
from libs.common.clock import ManualClock
from libs.common.config import Settings
from libs.common.embeddings import EmbeddingUnavailable, Vector
from libs.common.events import PostgresEventLog
from libs.common.fill import RequestLedger
from libs.common.vector_passes import vector_row_passes
from libs.common.vectorindex import IndexUnavailable, collection_name
from services.knowledge.backends import UnconfiguredBackend
from services.knowledge.bootstrap import build_backend
from services.knowledge.domain import (
    AUTO_DRAFTED_PARENT,
    COLLECTION_BASE,
    Access,
    KnowledgeHit,
    Limits,
    PromotionDraft,
    ReadContext,
    Reader,
    ReadSource,
    SearchOutcome,
    ServedMode,
    UnsearchedReason,
)
from services.knowledge.native import NativePages
from services.knowledge.native_search import NativeBackend
from services.knowledge.passes import PAGES, rebuild_index
from services.knowledge.scope import access_of
from services.knowledge.service import KnowledgeService
from services.prefetch.knowledge_block import render_search_result
from tests.support.app import open_app
from tests.support.embedders import DelegatingEmbedder
from tests.support.grpc_errors import error_info

DOMAIN = "knowledge.agentlearn.dev"
CTX = ReadContext(ReadSource.SEARCH_PAGES)

ROLES = {
    "sre": {"knowledge_containers": ["ops", "eng"]},
    "writer": {"knowledge_containers": ["docs"]},
    "intern": {"knowledge_containers": []},
}


def _settings(make_settings) -> Settings:
    return make_settings(
        company_defaults={"roles": {"sre": {"knowledge_containers": ["elsewhere"]}}},
        companies={"acme": {"roles": ROLES}},
    )


class CountingEmbedder(DelegatingEmbedder):
    """The real local model behind a switch: counts calls, and fails on demand."""

    def __init__(self, inner):  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.calls = 0
        self.fail = False

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        if self.fail:
            raise EmbeddingUnavailable("switched off by the test")
        return await self._inner.embed_pieces(pieces)

    async def embed(self, texts: Sequence[str]) -> list[Vector | None]:
        self.calls += 1
        if self.fail:
            raise EmbeddingUnavailable("switched off by the test")
        return await self._inner.embed(texts)


class DownIndex:
    """An index that never answers."""

    name = "down"

    async def upsert(self, collection, points):  # type: ignore[no-untyped-def]
        raise IndexUnavailable("down")

    async def delete(self, collection, ids):  # type: ignore[no-untyped-def]
        raise IndexUnavailable("down")

    async def search(self, collection, vector, **kwargs):  # type: ignore[no-untyped-def]
        raise IndexUnavailable("down")

    async def reset(self, collection):  # type: ignore[no-untyped-def]
        raise IndexUnavailable("down")

    async def count(self, collection):  # type: ignore[no-untyped-def]
        raise IndexUnavailable("down")

    async def close(self) -> None:
        pass


class NoIO:
    """Anything a no-I/O check must not touch."""

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        raise AssertionError(f"I/O attempted: .{name}")


@dataclass
class KB:
    settings: Settings
    pool: object
    service: KnowledgeService
    backend: NativeBackend
    embedder: CountingEmbedder
    index: object
    stub: pb_grpc.KnowledgeServiceStub
    legacy: legacy_grpc.KnowledgeServiceStub

    async def upsert(self, container: str, title: str, body: str, parents=(), company: str = "acme"):  # type: ignore[no-untyped-def]
        return await self.stub.UpsertPage(
            pb.UpsertPageRequest(
                company=company, container=container, title=title, body=body, parent_titles=list(parents)
            )
        )

    async def put(self, container: str, title: str, body: str, parents=(), company: str = "acme") -> str:  # type: ignore[no-untyped-def]
        return (await self.upsert(container, title, body, parents, company)).page.id

    def access(self, role: str = "sre", company: str = "acme", seat: str = "") -> Access:
        return access_of(self.settings, Reader(company, seat, role))

    async def search(self, query: str, role: str = "sre", company: str = "acme", limit: int = 10) -> SearchOutcome:
        return await self.service.search(Reader(company, "", role), query, limit, CTX)

    async def titles(self, query: str, role: str = "sre", company: str = "acme", limit: int = 10) -> list[str]:
        outcome = await self.search(query, role, company, limit)
        assert outcome.served is ServedMode.NATIVE, outcome
        return [h.title for h in outcome.hits]

    def other(self, embedder=None, index=None) -> NativeBackend:  # type: ignore[no-untyped-def]
        """The same pages behind another embedder or index (words only, index down)."""
        return NativeBackend(self.backend.pages, self.settings, embedder, index)


@contextlib.asynccontextmanager
async def _kb(dsn: str, settings: Settings, embedder, index):  # type: ignore[no-untyped-def]
    """The knowledge service served as it runs (its bootstrap, over real gRPC), with a counting embedder."""
    counting = CountingEmbedder(embedder)
    async with open_app(settings, dsn, names=["knowledge"], clock=ManualClock(), embedder=counting, index=index) as app:
        service = app.components["knowledge"].service
        assert isinstance(service.backend, NativeBackend)
        yield KB(
            settings,
            app.infra.pool,
            service,
            service.backend,
            counting,
            index,
            pb_grpc.KnowledgeServiceStub(app.channel),
            legacy_grpc.KnowledgeServiceStub(app.channel),
        )


@pytest.fixture
async def kb(dsn, make_settings, local_embedder, edge_index):  # type: ignore[no-untyped-def]
    async with _kb(dsn, _settings(make_settings), local_embedder, edge_index) as k:
        yield k


def operator(page_id: str, company: str = "acme") -> pb.GetPageRequest:
    return pb.GetPageRequest(reader=pb.Reader(company=company), page_id=page_id)


# ------------------------------------------------------------------------------------- UpsertPage / GetPage


async def test_upsert_creates_then_replaces_by_container_and_title(kb: KB):
    first = await kb.upsert("ops", "Deploy runbook", "Ship with make ship.", parents=["Runbooks"])
    assert first.created
    page = first.page
    assert (page.company, page.container, page.title, page.body) == (
        "acme",
        "ops",
        "Deploy runbook",
        "Ship with make ship.",
    )
    assert list(page.parent_titles) == ["Runbooks"]
    assert page.embedding_model == kb.embedder.model
    assert page.update_time.seconds > 0

    again = await kb.stub.UpsertPage(
        pb.UpsertPageRequest(company="acme", container="ops", title="Deploy runbook", body="Ship with make release.")
    )
    assert not again.created
    assert again.page.id == page.id
    assert again.page.body == "Ship with make release." and list(again.page.parent_titles) == []

    # Same title in another container (or company) is another page.
    other = await kb.stub.UpsertPage(
        pb.UpsertPageRequest(company="acme", container="eng", title="Deploy runbook", body="Another team's.")
    )
    assert other.created and other.page.id != page.id

    got = await kb.stub.GetPage(operator(page.id))
    assert got.page == again.page
    # The deprecated prefetch.v1 alias writes and reads the same pages.
    legacy = await kb.legacy.GetPage(legacy_pb.GetPageRequest(company="acme", page_id=page.id))
    assert (legacy.page.id, legacy.page.body) == (page.id, "Ship with make release.")
    aliased = await kb.legacy.UpsertPage(
        legacy_pb.UpsertPageRequest(company="acme", container="ops", title="Deploy runbook", body="Ship with make go.")
    )
    assert not aliased.created and aliased.page.id == page.id
    assert (await kb.stub.GetPage(operator(page.id))).page.body == "Ship with make go."


async def test_get_page_is_scoped_to_its_company_and_refuses_bad_ids(kb: KB):
    page_id = await kb.put("ops", "Pager policy", "Acknowledge within five minutes.")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.GetPage(operator(page_id, company="globex"))
    code, info, _ = error_info(err.value)
    assert code == grpc.StatusCode.NOT_FOUND
    assert (info.reason, info.domain, info.metadata["page_id"]) == ("PAGE_NOT_FOUND", DOMAIN, page_id)

    # An id no backend issues is not a page (native ids are UUIDs, Confluence's numbers).
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.GetPage(operator("not-a-uuid"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.GetPage(operator("no spaces/or slashes"))
    code, info, bad = error_info(err.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, bad.field_violations[0].field) == ("FIELD_INVALID", "page_id")


@pytest.mark.parametrize(
    ("change", "reason", "field"),
    [
        ({"company": ""}, "FIELD_REQUIRED", "company"),
        ({"container": ""}, "FIELD_REQUIRED", "container"),
        ({"container": "has space"}, "FIELD_INVALID", "container"),
        ({"title": "  "}, "FIELD_REQUIRED", "title"),
        ({"title": "Two\nlines"}, "FIELD_INVALID", "title"),
        ({"title": " padded"}, "FIELD_INVALID", "title"),
        ({"title": "x" * 256}, "FIELD_TOO_LONG", "title"),
        ({"body": ""}, "FIELD_REQUIRED", "body"),
        ({"parent_titles": ["Runbooks", ""]}, "FIELD_REQUIRED", "parent_titles[1]"),
        ({"parent_titles": [f"p{i}" for i in range(21)]}, "TOO_MANY_ITEMS", "parent_titles"),
    ],
)
async def test_upsert_refusals_name_the_field(kb: KB, change, reason, field):  # type: ignore[no-untyped-def]
    request = {"company": "acme", "container": "ops", "title": "Fine", "body": "Fine.", **change}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.UpsertPage(pb.UpsertPageRequest(**request))
    code, info, bad = error_info(err.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.domain) == (reason, DOMAIN)
    assert bad.field_violations[0].field == field
    assert await kb.pool.fetchval("SELECT count(*) FROM knowledge_pages") == 0


async def test_upsert_gives_a_new_page_the_id_asked_for(kb: KB):
    """A caller that records a page's id before writing it (a workspace lesson) asks for that id."""
    wanted = str(uuid.uuid4())
    first = await kb.stub.UpsertPage(
        pb.UpsertPageRequest(company="acme", container="ops", title="Rollback", body="make rollback.", page_id=wanted)
    )
    assert first.created and first.page.id == wanted
    # The title's page keeps its id whatever a later write asks for.
    again = await kb.stub.UpsertPage(
        pb.UpsertPageRequest(
            company="acme", container="ops", title="Rollback", body="make undo.", page_id=str(uuid.uuid4())
        )
    )
    assert not again.created and again.page.id == wanted and again.page.body == "make undo."
    # Another page's id is refused, and nothing is written.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.UpsertPage(
            pb.UpsertPageRequest(company="acme", container="ops", title="Other", body="x.", page_id=wanted)
        )
    code, info, bad = error_info(err.value)
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert (info.reason, info.domain, bad.field_violations[0].field) == ("PAGE_ID_TAKEN", DOMAIN, "page_id")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.UpsertPage(
            pb.UpsertPageRequest(company="acme", container="ops", title="Other", body="x.", page_id="not-a-uuid")
        )
    code, info, bad = error_info(err.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and bad.field_violations[0].field == "page_id", info
    assert await kb.pool.fetchval("SELECT count(*) FROM knowledge_pages") == 1


async def test_a_body_past_the_limit_is_refused_not_trimmed(kb: KB):
    small = NativePages(kb.backend.store, None, kb.index, ManualClock(), Limits(body_chars=100))
    from libs.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as err:
        await small.upsert_page("acme", "ops", "Long", "x" * 101, [])
    assert (err.value.reason, err.value.metadata["limit"]) == ("FIELD_TOO_LONG", "100")


def _distinct_words(chars: int) -> str:
    """Distinct five-letter words, ``chars`` characters at most: within the body's limit, more
    lexemes and positions than a tsvector holds (1 MiB)."""
    import itertools
    import string

    words, n = [], 0
    for letters in itertools.product(string.ascii_lowercase, repeat=5):
        if n + 6 > chars:
            break
        words.append("".join(letters))
        n += 6
    return " ".join(words)


async def test_a_body_too_large_for_the_full_text_index_is_the_callers_mistake_and_stores_nothing(kb: KB):
    kb.embedder.fail = True  # the refusal is Postgres's; the embed of ~1 MB would only slow the test
    body = _distinct_words(999_000)
    assert len(body) <= Limits().body_chars

    def refused(err: grpc.aio.AioRpcError) -> None:
        code, info, bad = error_info(err)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert (info.reason, info.domain, bad.field_violations[0].field) == ("BODY_TOO_LARGE", DOMAIN, "body")
        assert "full-text index" in err.details() and int(info.metadata["limit_bytes"]) > 0

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.UpsertPage(pb.UpsertPageRequest(company="acme", container="ops", title="Big", body=body))
    refused(err.value)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.legacy.UpsertPage(legacy_pb.UpsertPageRequest(company="acme", container="ops", title="Big", body=body))
    refused(err.value)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.WritePromotionDraft(
            pb.WritePromotionDraftRequest(company="acme", unit="platform", container_key="ops", title="Big", body=body)
        )
    refused(err.value)
    assert await kb.pool.fetchval("SELECT count(*) FROM knowledge_pages") == 0


async def test_a_page_is_stored_without_a_vector_when_the_embed_fails_and_is_still_found_by_words(kb: KB):
    kb.embedder.fail = True
    resp = await kb.stub.UpsertPage(
        pb.UpsertPageRequest(company="acme", container="ops", title="Pager policy", body="Acknowledge pages fast.")
    )
    assert resp.created and resp.page.embedding_model == ""
    assert await kb.pool.fetchval("SELECT embedding IS NULL FROM knowledge_pages") is True
    assert await kb.titles("pager acknowledge") == ["Pager policy"]


async def test_moving_a_page_between_parents_re_embeds_nothing(kb: KB):
    await kb.put("ops", "Rollback", "Redeploy the previous build.", parents=[AUTO_DRAFTED_PARENT])
    calls = kb.embedder.calls
    resp = await kb.upsert("ops", "Rollback", "Redeploy the previous build.", parents=["Runbooks"])
    assert kb.embedder.calls == calls
    assert resp.page.embedding_model == kb.embedder.model
    await kb.stub.UpsertPage(
        pb.UpsertPageRequest(company="acme", container="ops", title="Rollback", body="Redeploy the last good build.")
    )
    assert kb.embedder.calls == calls + 1


# ------------------------------------------------------------------------------------- scope


async def test_search_reads_only_the_roles_containers_in_its_own_company(kb: KB):
    await kb.put("ops", "Ops deploy runbook", "How to deploy the api.")
    await kb.put("eng", "Eng deploy conventions", "Deploy from main only.")
    await kb.put("docs", "Docs deploy style", "Write deploy notes in the changelog.")
    await kb.put("ops", "Globex deploy runbook", "Their deploy.", company="globex")
    await kb.put("elsewhere", "Default-company deploy", "Deploy elsewhere.", company="globex")

    assert sorted(await kb.titles("deploy")) == ["Eng deploy conventions", "Ops deploy runbook"]
    assert await kb.titles("deploy", role="writer") == ["Docs deploy style"]
    # A company without its own roles falls back to company_defaults: sre reads "elsewhere" there.
    assert await kb.titles("deploy", company="globex") == ["Default-company deploy"]

    for role in ("intern", "unknown-role"):
        outcome = await kb.search("deploy", role=role)
        assert outcome == SearchOutcome.did_not_run(UnsearchedReason.SCOPED_TO_NOTHING)


async def test_can_search_does_no_io(kb: KB):
    pages = NativePages(NoIO(), NoIO(), NoIO(), NoIO())  # type: ignore[arg-type]
    backend = NativeBackend(pages, kb.settings, NoIO(), NoIO())  # type: ignore[arg-type]
    service = KnowledgeService(kb.settings, pages, backend, NoIO())  # type: ignore[arg-type]
    for company, role, expected in [
        ("acme", "sre", True),
        ("acme", "writer", True),
        ("acme", "intern", False),
        ("acme", "unknown-role", False),
        ("globex", "sre", True),  # company_defaults
        ("globex", "writer", False),
    ]:
        assert service.can_search(Reader(company, "", role))[0] is expected, (company, role)
    assert UnconfiguredBackend().can_search(kb.access()) is False
    # Over gRPC too, with the containers it would read.
    resp = await kb.stub.CanSearch(pb.CanSearchRequest(reader=pb.Reader(company="acme", role="sre")))
    assert resp.can_search and list(resp.containers) == ["ops", "eng"] and not resp.unscoped


# ------------------------------------------------------------------------------------- exclusions


async def test_the_auto_drafted_subtree_and_auto_draft_titles_are_never_searched(kb: KB):
    await kb.put("ops", "Rollback runbook", "Rollback: redeploy the previous build.", parents=["Runbooks"])
    await kb.put("ops", AUTO_DRAFTED_PARENT, "Rollback drafts waiting for review.")
    await kb.put("ops", "Rollback procedure draft", "Rollback by redeploying.", parents=[AUTO_DRAFTED_PARENT])
    await kb.put("ops", "Nested rollback draft", "Rollback nested.", parents=["Team", AUTO_DRAFTED_PARENT, "Sub"])
    await kb.put("ops", "Lowercase rollback draft", "Rollback lower.", parents=["auto-drafted skills"])
    await kb.put("eng", "[Auto-draft] Rollback steps", "Rollback by the backstop.")
    await kb.put("eng", "[auto-draft] rollback again", "Rollback, lower-case prefix.")

    # Both halves: the words match every page, and so does the vector.
    assert await kb.titles("rollback redeploy previous build") == ["Rollback runbook"]

    # The exact scan (index down) applies the same exclusions.
    down = kb.other(kb.embedder, DownIndex())
    outcome = await down.search(kb.access(), "rollback redeploy previous build", 10)
    assert [h.title for h in outcome.hits] == ["Rollback runbook"]

    # A lead publishes a draft by moving it out of the subtree: now it is an ordinary page.
    await kb.put("ops", "Rollback procedure draft", "Rollback by redeploying.", parents=["Runbooks"])
    assert sorted(await kb.titles("rollback redeploy previous build")) == [
        "Rollback procedure draft",
        "Rollback runbook",
    ]


# ------------------------------------------------------------------------------------- ranking, snippets


async def test_snippets_are_one_line_around_the_match(kb: KB):
    filler = " ".join(f"word{i}" for i in range(200))
    body = f"# Cafeteria\n\n{filler}\n\nThe espresso machine is descaled on Fridays.\n\n{filler}"
    await kb.put("ops", "Kitchen notes", body)
    [hit] = (await kb.search("espresso descaling", limit=5)).hits
    assert "espresso machine is descaled" in hit.snippet
    assert "\n" not in hit.snippet
    assert len(hit.snippet) < 400 < len(body)
    assert hit.container == "ops" and hit.page_id


async def test_vector_and_lexical_halves_are_merged(kb: KB):
    await kb.put("ops", "Expense policy", "Keep receipts for anything above fifty euros and file claims monthly.")
    await kb.put("ops", "Travel booking", "Book trains through the travel desk; costs over budget need approval.")
    await kb.put("eng", "Cafeteria menu", "Lunch is served from noon; Tuesday is taco day.")
    query = "reimbursement for travel costs"

    titles = await kb.titles(query)
    # Found by its words and its meaning, then by meaning alone (it shares no word with the query).
    assert titles == ["Travel booking", "Expense policy"]

    words_only = kb.other(None, kb.index)
    assert [h.title for h in (await words_only.search(kb.access(), query, 10)).hits] == ["Travel booking"]

    down = kb.other(kb.embedder, DownIndex())
    assert [h.title for h in (await down.search(kb.access(), query, 10)).hits] == titles

    kb.embedder.fail = True  # the query cannot be embedded: the words still answer
    assert await kb.titles(query) == ["Travel booking"]


async def test_a_page_written_while_the_index_was_down_is_found_by_meaning_before_the_index_pass(
    dsn, make_settings, local_embedder, edge_index
):
    """The index refuses a page's upsert, then is back without its point: until the index pass puts
    it in, the index's answer would miss the page, so the exact scan answers."""
    from services.knowledge.passes import index_pending
    from tests.support.refusing_index import RefusingIndex

    index = RefusingIndex(edge_index)
    async with _kb(dsn, _settings(make_settings), local_embedder, index) as kb:
        await kb.put("ops", "Travel booking", "Book trains through the travel desk; costs over budget need approval.")
        await kb.put("eng", "Cafeteria menu", "Lunch is served from noon; Tuesday is taco day.")
        index.refusing = True
        waiting = await kb.put(
            "ops", "Expense policy", "Keep receipts for anything above fifty euros and file claims monthly."
        )
        assert await kb.pool.fetchval("SELECT indexed FROM knowledge_pages WHERE id = $1::uuid", waiting) is False
        index.refusing = False  # back, without the page's point
        # Found by meaning alone (it shares no word with the query), as when it is indexed.
        assert await kb.titles("reimbursement for travel costs") == ["Travel booking", "Expense policy"]
        assert await index_pending(kb.service.pages) == 1
        assert await kb.titles("reimbursement for travel costs") == ["Travel booking", "Expense policy"]


async def test_rarer_shared_words_rank_higher_and_the_limit_holds(kb: KB):
    for i in range(6):
        await kb.put("ops", f"Service note {i}", f"The service restarts nightly, note {i}.")
    await kb.put("ops", "Kafka service", "The kafka service restarts when the broker is rebalanced.")
    outcome = await kb.search("kafka service restarts", limit=3)
    assert outcome.served is ServedMode.NATIVE
    assert len(outcome.hits) == 3
    assert outcome.hits[0].title == "Kafka service"


# ------------------------------------------------------------------------------------- degraded


async def test_a_closed_store_is_unreachable_not_empty(kb: KB):
    await kb.put("ops", "Deploy runbook", "How to deploy.")
    await kb.pool.close()
    outcome = await kb.search("deploy", limit=5)
    assert outcome.served is None and outcome.unsearched is UnsearchedReason.UNREACHABLE and not outcome.hits
    onboarding = await kb.service.onboarding(Reader("acme", "ana", "sre"), ["ops"], CTX)
    assert onboarding.unsearched is UnsearchedReason.UNREACHABLE
    # The scope is decided before any I/O: a role with nothing to read is still "scoped to nothing".
    assert (await kb.search("deploy", role="intern")).unsearched is UnsearchedReason.SCOPED_TO_NOTHING
    # A read by id says the backend could not be read: UNAVAILABLE, never "not found".
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kb.stub.GetPage(operator("00000000-0000-0000-0000-000000000001"))
    code, info, _ = error_info(err.value)
    assert code == grpc.StatusCode.UNAVAILABLE and info.reason == "KNOWLEDGE_UNREACHABLE"


async def test_an_unconfigured_backend_says_so():
    backend = UnconfiguredBackend()
    access = Access(Reader("acme", "ana", "sre"), ("ops",))
    assert await backend.search(access, "deploy", 5) == SearchOutcome.did_not_run(
        UnsearchedReason.UNCONFIGURED, "no knowledge backend is configured"
    )
    assert not (await backend.onboarding(access, ["ops"], 5)).ran


# ------------------------------------------------------------------------------------- onboarding


async def test_onboarding_pages_follow_the_unit_chain(kb: KB):
    await kb.put("platform", "Onboarding", "Start here.")
    await kb.put("platform", "Your first deploy", "Deploy a hello world.", parents=["Onboarding"])
    await kb.put("platform", "Deploy runbook", "Not onboarding.", parents=["Runbooks"])
    await kb.put("platform", "Onboarding draft", "Hidden.", parents=[AUTO_DRAFTED_PARENT, "Onboarding"])
    await kb.put("eng", "Onboarding checklist", "Get your laptop.")
    await kb.put("eng", "Code review norms", "Two approvals.", parents=["Handbook", "Onboarding"])
    await kb.put("sales", "Onboarding for sales", "Not on the chain.")
    await kb.put("platform", "Onboarding", "Other company.", company="globex")

    reader = Reader("acme", "ana", "sre")
    hits = (await kb.service.onboarding(reader, ["platform", "eng"], CTX)).hits
    assert [(h.container, h.title) for h in hits] == [
        ("platform", "Onboarding"),
        ("platform", "Your first deploy"),
        ("eng", "Onboarding checklist"),
        ("eng", "Code review norms"),
    ]
    assert hits[1].snippet == "Deploy a hello world."
    assert (await kb.service.onboarding(reader, [], CTX)).hits == ()
    assert (await kb.service.onboarding(reader, ["nowhere"], CTX)).hits == ()


# ------------------------------------------------------------------------------------- the tool's words


def test_search_knowledge_answers_in_words_which_case_it_is():
    outcomes = {str(reason): SearchOutcome.did_not_run(reason) for reason in UnsearchedReason}
    outcomes["searched"] = SearchOutcome(ServedMode.NATIVE)
    texts = {name: render_search_result(outcome, "deploy runbook") for name, outcome in outcomes.items()}
    assert len(set(texts.values())) == len(UnsearchedReason) + 1 == 6
    assert "could not be searched" in texts["unreachable"] and "did not run" in texts["unreachable"]
    assert "refused the credential" in texts["credential_refused"] and "did not run" in texts["credential_refused"]
    assert "rate-limiting" in texts["rate_limited"] and "did not run" in texts["rate_limited"]
    assert "No knowledge base is configured" in texts["unconfigured"]
    assert "scoped to nothing" in texts["scoped_to_nothing"]
    assert "no page matched" in texts["searched"]
    assert all('"deploy runbook"' in t for t in texts.values())
    with pytest.raises(ValueError):
        SearchOutcome(None)  # an outcome either ran or says why it did not


def test_hits_render_as_bullets_and_an_exact_title_is_shown_whole():
    hits = [
        KnowledgeHit("id-1", "Deploy runbook", "ops", "make ship, then watch", body="Step 1. make ship\nStep 2. watch"),
        KnowledgeHit("id-2", "Deploy conventions", "eng", "from main only", body="..."),
    ]
    text = render_search_result(SearchOutcome(ServedMode.NATIVE, None, tuple(hits)), "deploy")
    assert text.splitlines()[1:3] == [
        "- **Deploy runbook** (container ops, page id-1): make ship, then watch",
        "- **Deploy conventions** (container eng, page id-2): from main only",
    ]
    assert "Step 2" not in text and "exact title" in text
    whole = render_search_result(SearchOutcome(ServedMode.NATIVE, None, tuple(hits)), "  deploy RUNBOOK ")
    assert whole.endswith("### Deploy runbook\n\nStep 1. make ship\nStep 2. watch")


# ------------------------------------------------------------------------------------- passes and seams


async def test_the_fill_embeds_pages_stored_without_a_vector_and_rebuild_restores_the_index(kb: KB, make_settings):
    kb.embedder.fail = True
    await kb.put("ops", "Expense policy", "Keep receipts for anything above fifty euros and file claims monthly.")
    kb.embedder.fail = False
    query = "reimbursement for travel costs"
    assert await kb.titles(query) == []

    infra = types.SimpleNamespace(
        pool=kb.pool,
        embedder=kb.embedder,
        settings=kb.settings,
        clock=kb.service.pages.clock,
        events=PostgresEventLog(kb.pool, kb.service.pages.clock),
        fill_requests=RequestLedger(),
    )
    [spec, orphans] = vector_row_passes("knowledge", PAGES, kb.service.pages.index, infra)
    assert spec.name == "knowledge-fill" and orphans.name == "knowledge-orphans"
    report = await spec.run()
    assert report["fill"].filled == 1
    assert await kb.titles(query) == ["Expense policy"]

    collection = collection_name(COLLECTION_BASE, kb.embedder.dimensions)
    await kb.index.reset(collection)
    assert await kb.index.count(collection) == 0
    assert await rebuild_index(kb.service.pages) == 1
    assert await kb.index.count(collection) == 1


async def test_the_native_promotion_writer_files_hidden_drafts_once_per_title(kb: KB):
    writer = kb.backend
    draft = PromotionDraft(
        company="acme",
        unit="platform",
        container_key="ops",
        title="Rotating the api keys",
        body="Rotate keys: revoke, reissue, redeploy.",
        tool_sequence=("vault_read", "vault_write", "deploy"),
        sibling_count=4,
        distinct_agents=3,
    )
    assert await writer.existing_draft("acme", "ops", draft.title) is None
    first = await writer.write_draft(draft)
    again = await writer.write_draft(draft)
    assert first.created and not again.created and again.page_id == first.page_id
    assert await writer.existing_draft("acme", "ops", draft.title) == again
    # Over gRPC: the same page, found by its title.
    resp = await kb.stub.WritePromotionDraft(
        pb.WritePromotionDraftRequest(
            company="acme", unit="platform", container_key="ops", title=draft.title, body=draft.body
        )
    )
    assert (resp.page_id, resp.created, resp.backend) == (first.page_id, False, pb.SERVED_MODE_NATIVE)
    rows = await kb.pool.fetch("SELECT title, parent_titles FROM knowledge_pages ORDER BY title")
    assert [(r["title"], list(r["parent_titles"])) for r in rows] == [
        (AUTO_DRAFTED_PARENT, []),
        ("Rotating the api keys", [AUTO_DRAFTED_PARENT]),
    ]
    assert await kb.titles("rotate api keys revoke reissue") == []


async def test_build_backend_wires_native_unless_told_otherwise(kb: KB, make_settings):
    assert build_backend(kb.settings, kb.backend) is kb.backend
    off = make_settings(knowledge={"backend": "none"})
    assert isinstance(build_backend(off, kb.backend), UnconfiguredBackend)
    await kb.put("ops", "Deploy runbook", "How to deploy.")
    # limit 0 means learning.prefetch.knowledge_results
    assert [h.title for h in (await kb.search("deploy", limit=0)).hits] == ["Deploy runbook"]


async def test_both_index_adapters_filter_by_company_and_container(dsn, make_settings, local_embedder, vector_index):  # type: ignore[no-untyped-def]
    async with _kb(dsn, _settings(make_settings), local_embedder, vector_index) as k:
        await k.put("ops", "Expense policy", "Keep receipts for anything above fifty euros and file claims monthly.")
        await k.put("docs", "Expense policy", "Keep receipts for anything above fifty euros and file claims monthly.")
        await k.put("ops", "Expense policy", "Keep receipts for anything above fifty euros.", company="globex")
        outcome = await k.search("reimbursement for travel costs")
        assert [(h.container, h.title) for h in outcome.hits] == [("ops", "Expense policy")]
