"""refresh_memory's one-at-a-time guard is a lease on the run's ledger row and holds no connection
while the refresh runs. It was a transaction-level advisory lock on a pooled connection kept through
the filter's model call, capped at half the pool per process: one company's few slow refreshes held
every slot and another company's refresh_memory queued behind them. Real services over gRPC, the
scripted model holding the filter calls open."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from tests.support.scripted_openai import Reply
from tests.test_prefetch_support import ROLES, llm_settings, open_env, purpose_of, refused, user_of

SLOW = "the slow lane"  # in the hint of each of big's refreshes: its filter call is held
NOTE = "The billing export runs on Mondays."
WAIT = 20.0  # a bound on what takes a second here; a refresh queued behind the held ones waits for ever


async def until(check: Callable[[], object]) -> None:
    async with asyncio.timeout(WAIT):
        while not check():
            await asyncio.sleep(0.01)


async def refresh(env, company: str, turn_id: str, hint: str) -> pb.RefreshMemoryResponse:  # type: ignore[no-untyped-def]
    return await env.builtins.RefreshMemory(
        pb.RefreshMemoryRequest(company=company, seat="ana", turn_id=turn_id, context_hint=hint, role="swe")
    )


def filter_asks(server: Any) -> list[dict]:
    return [b for b in server.received("chat") if purpose_of(b) == "memory_filter"]


def selecting_all(body: dict) -> str:
    ids = [line.split("]")[0][1:] for line in user_of(body).splitlines() if line.startswith("[n")]
    return json.dumps({"selected": ids})


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index, scripted_openai):
    scripted_openai.chat_handler = selecting_all
    settings = llm_settings(
        make_settings, scripted_openai, timeout=WAIT, companies={"big": {"roles": ROLES}, "small": {"roles": ROLES}}
    )
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as e:
        for company in ("big", "small"):
            await e.diary.WriteNote(
                diary_pb.WriteNoteRequest(
                    company=company,
                    seat="ana",
                    content="The billing export runs on Mondays.",
                    tier=diary_pb.NOTE_TIER_LONG,
                )
            )
        yield e


async def test_another_companys_refresh_does_not_wait_for_one_companys_slow_filters(env, scripted_openai):
    pool_size = env.service.deps.store.pool.get_max_size()
    slow = pool_size // 2 + 1  # more concurrent refreshes than the old guard let hold a connection
    gate = threading.Event()
    scripted_openai.rule(
        "chat", lambda body: Reply(hold=gate) if purpose_of(body) == "memory_filter" and SLOW in user_of(body) else None
    )
    bigs = [asyncio.create_task(refresh(env, "big", f"run-{i}", f"billing export, {SLOW}")) for i in range(slow)]
    try:
        await until(lambda: scripted_openai.held == slow)  # every one of them inside its filter call
        async with asyncio.timeout(WAIT):
            small = await refresh(env, "small", "run-0", "billing export, the fast lane")
        assert small.note_ids and small.refreshes_spent == 1
        assert not any(t.done() for t in bigs)  # answered while all of big's were still held
    finally:
        gate.set()
    async with asyncio.timeout(WAIT):
        answers = await asyncio.gather(*bigs)
    assert [(a.refreshes_spent, bool(a.note_ids)) for a in answers] == [(1, True)] * slow


async def test_one_runs_concurrent_refreshes_go_one_at_a_time_and_the_cap_holds(env, scripted_openai):
    gate = threading.Event()
    scripted_openai.rule("chat", lambda body: Reply(hold=gate) if purpose_of(body) == "memory_filter" else None)
    store = env.service.deps.store
    take = store._take_lease
    turned_away: set[uuid.UUID] = set()

    async def counting(run, holder, *rest):  # type: ignore[no-untyped-def]
        took = await take(run, holder, *rest)
        if not took:
            turned_away.add(holder)
        return took

    store._take_lease = counting
    hints = [f"billing export {w}" for w in ("alpha", "bravo", "charlie", "delta", "echo")]
    calls = [asyncio.create_task(refresh(env, "big", "run-1", h)) for h in hints]
    try:
        await until(lambda: scripted_openai.held == 1)
        await until(lambda: len(turned_away) == len(hints) - 1)  # every other call found the lease busy
        assert len(filter_asks(scripted_openai)) == 1  # ... and none of them reached the filter
    finally:
        gate.set()
        async with asyncio.timeout(WAIT):
            done = await asyncio.gather(*calls, return_exceptions=True)
    answered = sorted(d.refreshes_spent for d in done if isinstance(d, pb.RefreshMemoryResponse))
    assert answered == [1, 2, 3]
    refusals = [d for d in done if not isinstance(d, pb.RefreshMemoryResponse)]
    assert len(refusals) == 2
    for refusal in refusals:
        _, info, _ = await refused(_raise(refusal))
        assert info.reason == "REFRESH_LIMIT_REACHED"
    assert len(filter_asks(scripted_openai)) == 3


async def _raise(err: BaseException) -> None:
    raise err
