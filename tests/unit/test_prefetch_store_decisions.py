"""The prefetch's store-level decisions on its in-memory fake (tests/unit/fakes/prefetch.py), as
the turn start and the refresh tool rely on them: a run's context is built by its first caller and
frozen, later calls (a redelivery, a self_iterate round) read it; a failed build gives its claim
back; a dead build is taken over only once stale; the refresh ledger answers a repeated hint at no
cost, refuses at the cap and keeps the newest runs; a seat is onboarded once per unit chain.
The same decisions hold on Postgres: tests/test_prefetch_store_port.py runs these on both."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.common.events import Bookkeeping
from services.prefetch.ports import PrefetchStore
from services.prefetch.store import LedgerEntry, RunKey
from tests.unit.fakes.prefetch import FakePrefetchStore

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
RUN = RunKey("acme", "agent-1", "run-1")


@pytest.fixture
def store() -> PrefetchStore:
    return FakePrefetchStore()


async def check_first_call_builds_later_calls_read_the_frozen_context(store: PrefetchStore) -> None:
    assert await store.claim_context(RUN, T0)
    assert not await store.claim_context(RUN, T0)  # a second caller does not build
    building = await store.frozen_context(RUN)
    assert building is not None and (building.state, building.context) == ("building", None)
    assert await store.save_context(RUN, {"blocks": ["a"]}, T0, T0)
    for _ in range(2):  # a redelivery, a self_iterate round: the same context
        assert not await store.claim_context(RUN, T0 + timedelta(minutes=5))
        frozen = await store.frozen_context(RUN)
        assert frozen is not None and (frozen.state, frozen.context) == ("built", {"blocks": ["a"]})
    # Another run of the same seat is its own.
    assert await store.claim_context(RunKey("acme", "agent-1", "run-2"), T0)


async def check_a_failed_build_gives_its_claim_back_and_a_built_one_stays(store: PrefetchStore) -> None:
    assert await store.claim_context(RUN, T0)
    await store.release_context(RUN, T0)
    assert await store.frozen_context(RUN) is None
    assert await store.claim_context(RUN, T0)  # the next caller builds
    assert await store.save_context(RUN, {"v": 1}, T0, T0)
    await store.release_context(RUN, T0)  # a late release of a built context changes nothing
    frozen = await store.frozen_context(RUN)
    assert frozen is not None and frozen.context == {"v": 1}


async def check_a_dead_build_is_taken_over_only_once_stale(store: PrefetchStore) -> None:
    assert await store.claim_context(RUN, T0)
    assert not await store.take_over_context(RUN, T0, T0 + timedelta(seconds=1))  # not stale yet
    later = T0 + timedelta(minutes=2)
    assert await store.take_over_context(RUN, T0 + timedelta(microseconds=1), later)
    # The taker's claim is fresh: a second taker with the same stale mark loses.
    assert not await store.take_over_context(RUN, T0 + timedelta(microseconds=1), later)
    frozen = await store.frozen_context(RUN)
    assert frozen is not None and frozen.claim_time == later
    assert await store.save_context(RUN, {"v": 2}, later, later)
    assert not await store.take_over_context(RUN, later + timedelta(hours=1), later)  # built: never taken


async def check_a_taken_over_claim_is_the_takers_alone(store: PrefetchStore) -> None:
    """A builder taken over as stale may be slow rather than dead: when it finishes, its save does
    not land (nor its bookkeeping), its release does not free the taker's claim, and the context
    the taker froze stays as it was frozen."""
    assert await store.claim_context(RUN, T0)
    taken = await store.take_over_context(RUN, T0 + timedelta(microseconds=1), T0)  # a clock that did not move
    assert taken is not None and taken > T0  # still a claim of its own
    batch = Bookkeeping()
    batch.charge("acme", "agent-1", T0, 5)
    assert not await store.save_context(RUN, {"by": "slow"}, T0, T0, batch)  # the first claim's
    assert len(batch) == 2 and not batch.closed  # the seat's and the company's: held for its builder
    await store.release_context(RUN, T0)
    building = await store.frozen_context(RUN)
    assert building is not None and (building.state, building.claim_time) == ("building", taken)
    assert await store.save_context(RUN, {"by": "taker"}, T0, taken)
    assert not await store.save_context(RUN, {"by": "slow"}, T0, T0)
    assert not await store.save_context(RUN, {"by": "again"}, T0, taken)  # frozen: saved once
    frozen = await store.frozen_context(RUN)
    assert frozen is not None and (frozen.state, frozen.context) == ("built", {"by": "taker"})


async def check_the_ledger_caches_answers_refuses_at_the_cap_and_retries_failures(store: PrefetchStore) -> None:
    first = await store.reserve(*RUN, "h1", 2, 10, T0)  # cap 2, keep 10 runs
    assert (first.outcome, first.spent) == ("reserved", 1)
    await store.record_answer(*RUN, "h1", "hint one", LedgerEntry([{"id": "n1"}, {"id": "n2"}], 1), T0)
    repeat = await store.reserve(*RUN, "h1", 2, 10, T0)
    assert (repeat.outcome, repeat.spent) == ("cached", 1)
    assert repeat.entry is not None and (repeat.entry.notes, repeat.entry.shown) == ([{"id": "n1"}, {"id": "n2"}], 1)
    await store.record_shown(*RUN, "h1", 2, T0)
    await store.record_shown(*RUN, "h1", 1, T0)  # never fewer
    again = await store.reserve(*RUN, "h1", 2, 10, T0)
    assert again.entry is not None and again.entry.shown == 2
    # A failed hint spent its slot and is not cached: its retry spends again, then the cap refuses.
    assert (await store.reserve(*RUN, "h2", 2, 10, T0)).outcome == "reserved"
    await store.record_failure(*RUN, "h2", "hint two", T0)
    refused = await store.reserve(*RUN, "h2", 2, 10, T0)
    assert (refused.outcome, refused.spent) == ("refused", 2)
    # At the cap a cached hint is still answered, at no cost.
    assert (await store.reserve(*RUN, "h1", 2, 10, T0)).outcome == "cached"


async def check_the_ledger_keeps_the_newest_runs_of_the_company(store: PrefetchStore) -> None:
    for i in range(4):
        assert (await store.reserve("acme", "agent-1", f"run-{i}", "h", 5, 3, T0)).outcome == "reserved"
    assert await store.runs("acme") == 3
    # run-0 was evicted: its answer is dropped.
    await store.record_answer("acme", "agent-1", "run-0", "h", "h", LedgerEntry([{"id": "n"}], 1), T0)
    # run-0 starts afresh (its slot count and answers went with it); another company is untouched.
    assert (await store.reserve("acme", "agent-1", "run-0", "h", 5, 3, T0)).spent == 1
    assert (await store.reserve("globex", "agent-1", "run-0", "h", 5, 3, T0)).spent == 1
    assert await store.runs("acme") == 3 and await store.runs("globex") == 1


async def check_a_seat_is_onboarded_once_per_unit_chain(store: PrefetchStore) -> None:
    assert await store.marker("acme", "ana") is None
    await store.mark_onboarded("acme", "ana", "hash-1", ["unit-a"], T0)
    assert await store.marker("acme", "ana") == "hash-1"
    await store.mark_onboarded("acme", "ana", "hash-2", ["unit-a", "unit-b"], T0)  # the chain moved
    assert await store.marker("acme", "ana") == "hash-2" and await store.marker("acme", "bob") is None


async def check_old_contexts_are_pruned(store: PrefetchStore) -> None:
    for i in range(3):
        turn = f"run-{i}"
        assert await store.claim_context(RunKey("acme", "agent-1", turn), T0 + timedelta(hours=i))
        at = T0 + timedelta(hours=i)
        assert await store.save_context(RunKey("acme", "agent-1", turn), {"i": i}, at, at)
    assert await store.prune_contexts(T0 + timedelta(hours=1, minutes=30)) == 2
    assert await store.frozen_context(RunKey("acme", "agent-1", "run-0")) is None
    assert await store.frozen_context(RunKey("acme", "agent-1", "run-2")) is not None


CHECKS = [
    check_a_taken_over_claim_is_the_takers_alone,
    check_first_call_builds_later_calls_read_the_frozen_context,
    check_a_failed_build_gives_its_claim_back_and_a_built_one_stays,
    check_a_dead_build_is_taken_over_only_once_stale,
    check_the_ledger_caches_answers_refuses_at_the_cap_and_retries_failures,
    check_the_ledger_keeps_the_newest_runs_of_the_company,
    check_a_seat_is_onboarded_once_per_unit_chain,
    check_old_contexts_are_pruned,
]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_fake_store_decides(check, store: PrefetchStore) -> None:  # type: ignore[no-untyped-def]
    await check(store)
