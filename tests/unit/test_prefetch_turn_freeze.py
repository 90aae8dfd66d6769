"""The turn start's freezing (``TurnContextBuilder.build``) on the in-memory prefetch store, every
downstream service faked at its client boundary and down (each block degrades; the turn starts):
the first call of a run builds and freezes its context, a redelivery or a later round of the same
run is answered with the frozen one without asking any service again, another run builds its own,
and a build left claimed by a dead builder is taken over once stale. No Postgres, no gRPC."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from libs.common.auxmodel import AuxiliaryModel, OfflineRules, build_providers
from libs.common.clock import ManualClock
from libs.common.config import Settings
from services.prefetch.bootstrap import register_rules
from services.prefetch.deps import Deps
from services.prefetch.domain import TurnStart
from services.prefetch.past_turns import PastTurns
from services.prefetch.store import RunKey
from services.prefetch.turn_context import TurnContextBuilder
from tests.unit.fakes.events import RecordedEvents as FakeEvents
from tests.unit.fakes.prefetch import DownstreamDown, FakePrefetchStore

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _builder() -> tuple[TurnContextBuilder, FakePrefetchStore, DownstreamDown, FakeEvents, ManualClock]:
    settings, clock = Settings(), ManualClock(T0)
    rules = OfflineRules()
    register_rules(rules)
    aux = AuxiliaryModel(settings, build_providers(settings, rules), None, None, clock)
    store, down, events = FakePrefetchStore(), DownstreamDown(), FakeEvents()
    downstream: Any = down
    deps = Deps(settings, aux, None, downstream, store, downstream, events, clock)
    return TurnContextBuilder(deps, PastTurns(aux, settings.learning)), store, down, events, clock


def _start(turn_id: str = "run-1") -> TurnStart:
    return TurnStart("acme", "agent-1", "support", turn_id, "find last month's invoice for globex", False)


def _builds(events: FakeEvents) -> int:
    return events.kinds().count("prefetch_summary")


async def test_a_runs_context_is_built_once_and_redelivered_frozen() -> None:
    builder, store, down, events, clock = _builder()
    first = await builder.build(_start())
    assert _builds(events) == 1 and down.calls  # built: the services were asked (and were down)
    frozen = await store.frozen_context(RunKey("acme", "agent-1", "run-1"))
    assert frozen is not None and frozen.state == "built" and frozen.context == first.to_json()

    asked = len(down.calls)
    clock.advance(minutes=3)
    for _ in range(2):  # a redelivery, a self_iterate round
        again = await builder.build(_start())
        assert again.to_json() == first.to_json()
    assert _builds(events) == 1 and len(down.calls) == asked  # nothing asked again

    await builder.build(_start("run-2"))  # another run builds its own
    assert _builds(events) == 2


async def test_a_build_left_claimed_by_a_dead_builder_is_taken_over_once_stale() -> None:
    builder, store, _, events, clock = _builder()
    assert await store.claim_context(RunKey("acme", "agent-1", "run-1"), T0)  # a builder that then died
    clock.advance(seconds=builder._claim_seconds() + 1)
    context = await builder.build(_start())
    assert _builds(events) == 1
    frozen = await store.frozen_context(RunKey("acme", "agent-1", "run-1"))
    assert frozen is not None and frozen.state == "built" and frozen.context == context.to_json()
    assert frozen.claim_time == clock.now()  # the taker's claim


async def test_a_slow_builder_taken_over_as_stale_freezes_nothing_and_answers_the_frozen_context() -> None:
    """Spec: prefetch_summary "once per turn", the context "frozen at turn start". A builder whose
    claim was taken over was slow, not dead: when it finishes, its save does not land; it writes no
    second summary, leaves the taker's context as frozen and answers with it."""
    builder, store, down, events, clock = _builder()
    slow = down.stalled = asyncio.Event()
    first = asyncio.create_task(builder.build(_start()))
    while not down.calls:  # the first builder is waiting on a slow service
        await asyncio.sleep(0)
    down.stalled = None
    clock.advance(seconds=builder._claim_seconds() + 1)  # its claim now looks dead
    taker = await builder.build(_start())
    slow.set()
    late = await first
    assert _builds(events) == 1
    frozen = await store.frozen_context(RunKey("acme", "agent-1", "run-1"))
    assert frozen is not None and frozen.context == taker.to_json()
    assert late.to_json() == taker.to_json()
