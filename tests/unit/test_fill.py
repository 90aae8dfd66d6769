"""The vector fill's minute on fakes (unit tier): the walk over companies and seats, the request
and byte budgets and where a spent minute resumes, the isolation of a refused row, the
configuration pause and what releases it, the provider's "not now" shared by every fill of the
process, a vector with no direction, and a long row embedded across minutes.

No Postgres, no model: the bookkeeping is ``MemoryFillLedger`` (the rules of ``FILL_SQL``), the
rows ``MemoryFillSource``, the embedder a scripted hashing one. tests/test_diary_fill.py and
tests/test_episodes_fill.py run the same fill on the real parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from libs.common.clock import ManualClock
from libs.common.config import EmbeddingsConfig, FillConfig
from libs.common.embeddings import EmbeddingRateLimited, EmbeddingRefused, pool
from libs.common.fill import FillState, RequestLedger, VectorFill
from tests.unit.fakes.embedder import hash_vector
from tests.unit.fakes.events import RecordedEvents
from tests.unit.fakes.fill import MemoryFillLedger, MemoryFillSource, ScriptedFillEmbedder

HOUR = 3600


@dataclass
class Rig:
    fill: VectorFill
    ledger: MemoryFillLedger
    source: MemoryFillSource
    embedder: ScriptedFillEmbedder
    clock: ManualClock
    events: RecordedEvents
    requests: RequestLedger
    embeddings: EmbeddingsConfig

    def window_spent(self, company: str) -> int:
        return self.ledger.spent.get((company, self.clock.now().replace(second=0, microsecond=0)), 0)

    def next_minute(self) -> None:
        self.clock.advance(seconds=60)


def rig(*, model: str = "hash-64", piece_words: int = 0, **fill: Any) -> Rig:
    clock = ManualClock()
    ledger, source, events, requests = MemoryFillLedger(), MemoryFillSource(), RecordedEvents(), RequestLedger()
    embedder = ScriptedFillEmbedder(model, piece_words)
    embeddings = EmbeddingsConfig(kind="local", model=model)
    vf = VectorFill(ledger, [source], embedder, FillConfig(**fill), embeddings, clock, events, requests)
    return Rig(vf, ledger, source, embedder, clock, events, requests, embeddings)


async def test_a_minute_fills_every_seat_and_charges_the_company_its_bytes() -> None:
    r = rig()
    ids = [r.source.add("acme", seat, f"{seat} note {i}") for seat in ("bo", "ana") for i in range(2)]
    report = await r.fill.run_minute()
    assert report.ended_by is None
    assert report.filled == 4
    assert report.seats_done == ["acme/ana", "acme/bo"]
    assert report.requests == 2  # one batch a seat
    assert all(r.source.vector(i) is not None for i in ids)
    size = sum(r.source.entries[i].row.size for i in ids)
    assert report.bytes == size
    assert r.window_spent("acme") == size
    assert r.ledger.states[("notes", "acme")].cursor_seat is None  # the walk went through


async def test_a_spent_request_budget_ends_the_minute_and_the_next_resumes_at_that_seat() -> None:
    r = rig(requests_per_minute=3, batch_size=1)
    for seat, n in (("ana", 2), ("bo", 3)):
        for i in range(n):
            r.source.add("acme", seat, f"{seat} note {i}")
    report = await r.fill.run_minute()
    # While the first answer is pending a request needs room for the probe after it: 2 of 3, then
    # one at a time: ana's two and bo's first.
    assert report.ended_by == "requests"
    assert report.filled == 3
    assert report.seats_done == ["acme/ana"]
    assert r.ledger.states[("notes", "acme")].cursor_seat == "bo"
    assert r.ledger.states[("notes", "")].cursor_seat == "acme"
    assert await r.requests.ended(r.clock.now()) is None  # a budget is not the provider's "not now"

    r.source.add("acme", "al", "al note")  # sorts before the cursor
    r.next_minute()
    sent_before = len(r.embedder.requests)
    report = await r.fill.run_minute()
    assert report.ended_by is None
    assert report.filled == 3
    assert r.embedder.requests[sent_before] == ["bo note 1"]  # resumed at bo, not at al
    assert r.embedder.requests[-1] == ["al note"]  # the seats before the cursor come last
    assert r.ledger.states[("notes", "acme")].cursor_seat is None


async def test_one_companys_spent_bytes_end_its_minute_only() -> None:
    r = rig(company_bytes_per_minute=100)
    acme = [r.source.add("acme", "ana", f"acme note number {i}".ljust(40, ".")) for i in range(3)]
    beta = r.source.add("beta", "bo", "beta note".ljust(40, "."))
    report = await r.fill.run_minute()
    # 100 bytes less the probe word's 5 kept back while the first answer is pending: two rows fit.
    assert report.ended_by == "bytes"
    assert [r.source.vector(i) is not None for i in acme] == [True, True, False]
    assert r.source.vector(beta) is not None  # the other company went on
    assert (r.window_spent("acme"), r.window_spent("beta")) == (80, 40)
    assert r.ledger.states[("notes", "acme")].cursor_seat == "ana"
    assert await r.requests.ended(r.clock.now()) is None

    r.next_minute()
    report = await r.fill.run_minute()
    assert report.filled == 1 and report.ended_by is None
    assert r.source.vector(acme[2]) is not None


async def test_a_refused_row_is_isolated_held_alone_an_hour_then_offered_alone() -> None:
    r = rig()
    ids = [r.source.add("acme", "ana", f"note {i}") for i in range(3)]
    bad = r.source.add("acme", "ana", "note forbidden")
    r.embedder.refused = {"forbidden"}
    report = await r.fill.run_minute()
    assert report.ended_by is None
    assert report.filled == 3 and report.refused_held == 1
    assert ["hello"] in r.embedder.requests  # the first refusal was judged by the probe word
    assert [e["row"] for e in r.events.of("memory_fill_input_refused")] == [str(bad)]
    held = r.source.entries[bad]
    assert held.alone and held.held_until == r.clock.now() + timedelta(seconds=HOUR)
    assert all(r.source.vector(i) is not None for i in ids)

    r.next_minute()
    sent = len(r.embedder.requests)
    assert (await r.fill.run_minute()).filled == 0
    assert len(r.embedder.requests) == sent  # held: not offered within the hour

    r.embedder.refused = set()
    r.clock.advance(seconds=HOUR)
    report = await r.fill.run_minute()
    assert report.filled == 1
    assert r.embedder.requests[-1] == ["note forbidden"]  # alone
    assert r.source.vector(bad) is not None


async def test_a_refused_configuration_pauses_every_fill_until_the_provider_changes() -> None:
    r = rig()
    row = r.source.add("acme", "ana", "a note")
    r.embedder.fail(EmbeddingRefused("model not served"))
    report = await r.fill.run_minute()
    assert report.ended_by == "configuration_refused"
    assert r.embedder.requests == [["a note"], ["hello"]]
    assert len(r.events.of("memory_fill_configuration_refused")) == 1
    assert r.source.entries[row].held_until is None  # the rows are not at fault
    assert r.ledger.states[("*", "*")] == FillState(
        None, r.clock.now() + timedelta(seconds=HOUR), r.embeddings.fingerprint()
    )
    assert await r.requests.ended(r.clock.now()) == "configuration_refused"

    r.embedder.fail(None)
    r.next_minute()
    assert (await r.fill.run_minute()).ended_by == "paused"
    assert await r.fill.paused_until() == r.clock.now() + timedelta(seconds=HOUR - 60)
    assert len(r.embedder.requests) == 2

    # Another model (a new fingerprint) is not under the pause: it fills at once.
    other = EmbeddingsConfig(kind="local", model="hash-other")
    embedder = ScriptedFillEmbedder("hash-other")
    refill = VectorFill(r.ledger, [r.source], embedder, FillConfig(), other, r.clock, r.events, RequestLedger())
    assert await refill.paused_until() is None
    assert (await refill.run_minute()).filled == 1


async def test_a_rate_limit_ends_the_minute_for_every_fill_of_the_process() -> None:
    r = rig()
    episodes = MemoryFillSource("episodes")
    episode = episodes.add("acme", "ana", "an episode")
    r.source.add("acme", "ana", "a note")
    second = VectorFill(r.ledger, [episodes], r.embedder, FillConfig(), r.embeddings, r.clock, r.events, r.requests)
    r.embedder.fail(EmbeddingRateLimited("429"))
    assert (await r.fill.run_minute()).ended_by == "rate_limited"
    r.embedder.fail(None)
    sent = len(r.embedder.requests)
    assert (await second.run_minute()).ended_by == "rate_limited"
    assert len(r.embedder.requests) == sent  # the other fill sent nothing in that minute

    r.next_minute()
    assert (await second.run_minute()).filled == 1
    assert episodes.vector(episode) is not None


async def test_a_vector_with_no_direction_holds_only_its_row() -> None:
    r = rig()
    good = r.source.add("acme", "ana", "a fine note")
    void = r.source.add("acme", "ana", "a void note")
    r.embedder.void = {"void"}
    report = await r.fill.run_minute()
    assert report.filled == 1 and report.unusable_held == 1
    assert r.source.vector(good) is not None and r.source.vector(void) is None
    entry = r.source.entries[void]
    assert entry.held_until == r.clock.now() + timedelta(seconds=HOUR) and not entry.alone
    assert [e["row"] for e in r.events.of("memory_fill_vector_unusable")] == [str(void)]


async def test_a_row_longer_than_the_byte_budget_is_embedded_across_minutes_from_its_kept_pieces() -> None:
    r = rig(company_bytes_per_minute=60, piece_words=2)
    words = [f"w{i:02d}" for i in range(20)]
    text = " ".join(words)  # 79 bytes: longer than a minute's budget, ten pieces of 7 bytes
    row = r.source.add("acme", "ana", text)
    pieces = [" ".join(words[i : i + 2]) for i in range(0, 20, 2)]

    report = await r.fill.run_minute()
    # 55 bytes (60 less the probe's 5) take seven pieces; then one more in the 11 left; the
    # next does not fit the 4 bytes left.
    assert report.ended_by == "bytes"
    assert r.embedder.requests == [pieces[:7], pieces[7:8]]
    assert len(r.ledger.pieces[("notes", row)]) == 8
    assert [e["pieces_in"] for e in r.events.of("memory_fill_input_continued")] == [7, 8]
    assert r.source.vector(row) is None

    r.next_minute()
    report = await r.fill.run_minute()
    assert report.filled == 1
    assert r.embedder.requests[2:] == [pieces[8:]]  # resumed at the ninth piece
    stored = r.source.vector(row)
    assert stored is not None
    expected = pool([hash_vector(p) for p in pieces], [len(p) for p in pieces])
    assert expected is not None
    np.testing.assert_allclose(stored.values, expected, rtol=1e-6)
    assert ("notes", row) not in r.ledger.pieces
