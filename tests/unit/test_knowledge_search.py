"""The native knowledge backend's use cases on fakes (unit tier): the inline embed and index
bookkeeping of a page write, search scoped to the access's containers with both halves, the vector
half's exact-scan fallback and re-read, the similarity floor, the auto-draft exclusion, and what a
search that could not run reports.

No Postgres, no model, no gRPC: ``MemoryPageStore``, the exact-scan index in memory, the hashing
embedder. The integration tier (tests/test_knowledge*.py) runs the same use cases on the real parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.common.clock import ManualClock
from libs.common.config import Settings
from libs.common.embeddings import EmbeddingUnavailable
from libs.common.vectorindex import collection_name
from libs.common.vectorindex.exact_scan import ExactScanIndex
from services.knowledge.domain import (
    AUTO_DRAFTED_PARENT,
    COLLECTION_BASE,
    Access,
    Page,
    PromotionDraft,
    Reader,
    SearchOutcome,
    ServedMode,
    UnsearchedReason,
)
from services.knowledge.native import NativePages, index_point
from services.knowledge.native_search import NativeBackend
from tests.unit.fakes.embedder import HashingEmbedder
from tests.unit.fakes.knowledge import MemoryPageStore

COLL = collection_name(COLLECTION_BASE, 64)


@dataclass
class Knowledge:
    backend: NativeBackend
    pages: NativePages[MemoryPageStore]
    store: MemoryPageStore
    index: ExactScanIndex
    embedder: HashingEmbedder

    async def page(self, container: str, title: str, body: str, parents: list[str] | None = None) -> Page:
        page, _, _ = await self.pages.upsert_page("acme", container, title, body, parents or [])
        return page

    async def search(self, query: str, *containers: str, limit: int = 5) -> SearchOutcome:
        return await self.backend.search(Access(Reader("acme", "ana", "dev"), containers), query, limit)


def knowledge(min_similarity: float | None = None, embedder: bool = True) -> Knowledge:
    store, index, emb = MemoryPageStore(), ExactScanIndex(), HashingEmbedder()
    pages = NativePages(store, emb if embedder else None, index, ManualClock())
    kw = {} if min_similarity is None else {"min_similarity": min_similarity}
    backend = NativeBackend(pages, Settings(), emb if embedder else None, index, **kw)
    return Knowledge(backend, pages, store, index, emb)


def titles(outcome: SearchOutcome) -> list[str]:
    assert outcome.served is ServedMode.NATIVE
    return [h.title for h in outcome.hits]


async def test_a_page_write_is_embedded_and_indexed_or_waits_for_the_index():
    k = knowledge()
    up = await k.page("eng", "Deploys", "deploys go through staging")
    assert up.embedding_model == "hash-64" and k.store.indexed(up.uuid) and await k.index.count(COLL) == 1
    k.index.available = False
    waiting = await k.page("eng", "Rollbacks", "roll back with the release tool")
    assert waiting.embedding_model == "hash-64" and not k.store.indexed(waiting.uuid)


async def test_search_is_scoped_to_the_access_containers():
    k = knowledge()
    await k.page("eng", "Oncall", "the oncall rotation changes on monday")
    await k.page("sales", "Oncall sales", "the oncall rotation for sales changes on monday")
    await k.pages.upsert_page("other", "eng", "Oncall other", "the oncall rotation changes on monday", [])
    assert titles(await k.search("oncall rotation monday", "eng")) == ["Oncall"]
    assert sorted(titles(await k.search("oncall rotation monday", "eng", "sales"))) == ["Oncall", "Oncall sales"]
    nothing = await k.search("oncall", limit=5)
    assert nothing.unsearched is UnsearchedReason.SCOPED_TO_NOTHING


async def test_index_down_the_vector_half_is_the_exact_scan_with_the_same_answer():
    k = knowledge()
    for title, body in [
        ("Certs", "renew certificates yearly"),
        ("Keys", "rotate keys and certificates"),
        ("Lunch", "lunch menu for the week"),
    ]:
        await k.page("eng", title, body)
    by_index = await k.search("renew certificates", "eng")
    assert "hydrate" in k.store.calls and "exact" not in k.store.calls
    k.index.available = False
    k.store.calls.clear()
    by_scan = await k.search("renew certificates", "eng")
    assert "exact" in k.store.calls and "hydrate" not in k.store.calls
    assert titles(by_scan) == titles(by_index) and titles(by_index)[0] == "Certs"


async def test_a_page_written_while_the_index_was_down_is_found_by_the_exact_scan_until_indexed():
    k = knowledge()
    await k.page("eng", "Lunch", "lunch menu for the week")
    k.index.available = False
    waiting = await k.page("eng", "Certs", "renew certificates yearly")
    k.index.available = True  # back, without the page's point
    k.store.calls.clear()
    assert titles(await k.search("renew certificates", "eng"))[0] == "Certs"
    assert "exact" in k.store.calls  # the index's answer would have missed it
    # The index pass's step: the stored vector's point upserted and the page marked indexed.
    vector = k.store.rows[waiting.uuid].vector
    assert vector is not None
    assert await k.pages.index_row(index_point(waiting.uuid, "acme", "eng", vector, "hash-64"), "page")
    k.store.calls.clear()
    assert titles(await k.search("renew certificates", "eng"))[0] == "Certs"
    assert "hydrate" in k.store.calls and "exact" not in k.store.calls


async def test_a_deleted_page_is_not_a_hit_though_its_point_remains():
    k = knowledge()
    await k.page("eng", "Kept", "the build cache lives in s3")
    gone = await k.page("eng", "Gone", "the build cache lives in s3 too")
    k.store.delete(gone.uuid)
    assert await k.index.count(COLL) == 2
    assert titles(await k.search("build cache", "eng")) == ["Kept"]


async def test_the_similarity_floor_keeps_unrelated_pages_out_of_the_vector_half():
    floored, open_ = knowledge(), knowledge(min_similarity=-1.0)
    for k in (floored, open_):
        await k.page("eng", "Related", "database failover runbook")
        await k.page("eng", "Unrelated", "holiday calendar")
    assert titles(await floored.search("database failover", "eng")) == ["Related"]
    assert sorted(titles(await open_.search("database failover", "eng"))) == ["Related", "Unrelated"]


async def test_drafts_are_no_hit_of_either_half():
    k = knowledge()
    draft = PromotionDraft("acme", "dev", "eng", "Flaky test triage", "triage flaky tests by rerunning", (), 3, 2)
    result = await k.backend.write_draft(draft)
    assert result.created and await k.index.count(COLL) == 2  # the draft and its parent page
    assert (await k.store.by_title("acme", "eng", "Flaky test triage")).parent_titles == (AUTO_DRAFTED_PARENT,)
    assert titles(await k.search("triage flaky tests", "eng")) == []
    k.index.available = False
    assert titles(await k.search("triage flaky tests", "eng")) == []


async def test_without_a_vector_the_lexical_half_still_answers():
    k = knowledge()
    await k.page("eng", "Backups", "backups run nightly")
    k.embedder.failure = EmbeddingUnavailable("503")
    assert titles(await k.search("nightly backups", "eng")) == ["Backups"]
    bare = knowledge(embedder=False)
    await bare.page("eng", "Backups", "backups run nightly")
    assert titles(await bare.search("nightly backups", "eng")) == ["Backups"]


async def test_an_unreadable_store_is_a_search_that_did_not_run():
    k = knowledge()
    await k.page("eng", "Backups", "backups run nightly")
    k.store.down = True
    outcome = await k.search("backups", "eng")
    assert outcome.served is None and outcome.unsearched is UnsearchedReason.UNREACHABLE


async def test_a_blank_query_is_served_empty():
    k = knowledge()
    await k.page("eng", "Backups", "backups run nightly")
    outcome = await k.search("   ", "eng")
    assert outcome.served is ServedMode.NATIVE and outcome.hits == () and k.store.calls == []


class _BrokenIndex(ExactScanIndex):
    """An index failing in a way that is not "unreachable" (a bug, a bad request)."""

    async def search(self, *args: object, **kwargs: object) -> list[object]:
        raise RuntimeError("bad request")


async def test_an_index_error_that_is_not_unreachable_is_not_hidden_by_the_exact_scan():
    k = knowledge()
    await k.page("eng", "Backups", "backups run nightly")
    k.backend.index = _BrokenIndex()
    outcome = await k.search("nightly backups", "eng", "ops")
    assert outcome.served is None and outcome.unsearched is UnsearchedReason.UNREACHABLE
    assert "exact" not in k.store.calls
