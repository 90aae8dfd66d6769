"""refresh_memory: the per-run cap refused with the count spent, the idempotency cache (a repeat of
a normalised hint answered from the ledger without a model call, a larger limit getting more), a
failed filter spending its slot while the same hint may be retried, isolation between run ids and
seats, and the ledger bounded to the newest 256 runs of a seat. Real services over gRPC."""

from __future__ import annotations

import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from tests.support.scripted_openai import Reply
from tests.test_prefetch_support import (
    ROLES,
    default_settings,
    llm_settings,
    open_env,
    purpose_of,
    refused,
    select_containing,
)

BOB = pb.Counterparty(handle="bob", platform="slack", display_name="Bob")


def refresh(env, hint: str, *, turn_id: str = "run-1", limit: int = 0, seat: str = "ana", **kw):  # type: ignore[no-untyped-def]
    return env.builtins.RefreshMemory(
        pb.RefreshMemoryRequest(
            company="acme", seat=seat, turn_id=turn_id, context_hint=hint, limit=limit, role="swe", **kw
        )
    )


async def filter_calls(env) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for e in await env.events("auxiliary_spend") if e["payload"]["purpose"] == "memory_filter")


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


async def test_the_cap_refuses_the_fourth_fresh_hint_with_the_count_spent(env):
    await env.note("The billing export runs on Mondays.")
    for n, hint in enumerate(["billing export", "deploy pipeline", "holiday calendar"], 1):
        resp = await refresh(env, hint)
        assert (resp.refreshes_spent, resp.refreshes_allowed, resp.from_ledger) == (n, 3, False)
        assert f"Refresh {n} of 3 this turn" in resp.text
    code, info, bad = await refused(refresh(env, "something else entirely"))
    assert code.name == "RESOURCE_EXHAUSTED" and info.reason == "REFRESH_LIMIT_REACHED"
    assert info.domain == "prefetch.agentlearn.dev"
    assert {"spent": "3", "allowed": "3", "turn_id": "run-1"}.items() <= dict(info.metadata).items()
    assert bad.field_violations[0].field == "turn_id"
    assert "already spent 3 of its 3 refreshes" in bad.field_violations[0].description
    assert await filter_calls(env) == 3


async def test_a_repeated_hint_is_answered_from_the_ledger_without_a_model_call(env):
    note = await env.note("The billing export runs on Mondays.")
    first = await refresh(env, "Billing export schedule")
    assert list(first.note_ids) == [note] and "The billing export runs on Mondays." in first.text
    calls = await filter_calls(env)
    # Case and whitespace do not make a new hint; the answer is free, even past the cap.
    await refresh(env, "deploy pipeline")
    await refresh(env, "holiday calendar")
    again = await refresh(env, "  billing   EXPORT schedule ")
    assert again.from_ledger and list(again.note_ids) == [note]
    assert again.refreshes_spent == 3 and "no refresh spent" in again.text
    assert await filter_calls(env) == calls + 2  # only the two fresh hints asked the model
    assert await env.uses(note) == 1  # a ledger answer is not a new selection


async def test_nothing_bears_is_cached_too(env):
    await env.note("The cafeteria closes at two.")
    first = await refresh(env, "kubernetes upgrade")
    assert list(first.note_ids) == [] and first.text.startswith('Nothing in your diary bears on "kubernetes upgrade"')
    again = await refresh(env, "KUBERNETES upgrade")
    assert again.from_ledger and again.refreshes_spent == 1 and again.text.startswith("Nothing in your diary")


async def test_a_larger_limit_on_a_repeat_gets_the_extra_notes_and_marks_only_those(env):
    ids = [await env.note(f"Billing export fact number {i}.") for i in range(6)]
    first = await refresh(env, "billing export", limit=2)
    assert len(first.note_ids) == 2 and "4 more selected" in first.text
    bigger = await refresh(env, "billing export", limit=5)
    assert bigger.from_ledger and bigger.refreshes_spent == 1
    assert len(bigger.note_ids) == 5 and list(bigger.note_ids[:2]) == list(first.note_ids)
    uses = {n: await env.uses(n) for n in ids}
    assert sorted(uses.values()) == [0, 1, 1, 1, 1, 1]  # each shown note counted once, the unshown one not
    smaller = await refresh(env, "billing export", limit=1)
    assert list(smaller.note_ids) == list(first.note_ids[:1])
    assert sorted([await env.uses(n) for n in ids]) == [0, 1, 1, 1, 1, 1]


async def test_a_failed_filter_spends_its_slot_and_the_same_hint_runs_again(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    scripted_openai.push("chat", Reply(status=500))
    scripted_openai.chat_handler = select_containing("billing")
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        note = await env.note("The billing export runs on Mondays.")
        failed = await refresh(env, "billing export", senders=[BOB])
        assert failed.refreshes_spent == 1 and list(failed.note_ids) == []
        assert "could not run" in failed.text and "retry" in failed.text
        retried = await refresh(env, "billing export")
        assert not retried.from_ledger and retried.refreshes_spent == 2 and list(retried.note_ids) == [note]
        asks = [b for b in scripted_openai.received("chat") if purpose_of(b) == "memory_filter"]
        assert len(asks) == 2  # the retry re-ran the filter
        assert "Who triggered it: Bob (slack)" in asks[0]["messages"][1]["content"]
        # Now cached: a third call is free.
        third = await refresh(env, "Billing Export")
        assert third.from_ledger and third.refreshes_spent == 2


async def test_state_is_per_run_id_and_per_seat(env):
    await env.note("The billing export runs on Mondays.")
    await env.note("The billing export runs on Mondays.", seat="zed")
    for hint in ("a billing", "b billing", "c billing"):
        await refresh(env, hint, turn_id="run-1")
    await refused(refresh(env, "d billing", turn_id="run-1"))
    other_run = await refresh(env, "a billing", turn_id="run-2")  # a redelivery runs afresh
    assert other_run.refreshes_spent == 1 and not other_run.from_ledger
    other_seat = await refresh(env, "a billing", turn_id="run-1", seat="zed")
    assert other_seat.refreshes_spent == 1 and not other_seat.from_ledger


async def test_the_ledger_keeps_the_newest_256_runs_of_a_seat(env, clock):
    store = env.service.deps.store
    await env.note("The billing export runs on Mondays.")
    await refresh(env, "billing export", turn_id="run-0")
    for i in range(1, 256):
        await store.reserve("acme", "ana", f"run-{i}", "k", 3, 256, clock.now())
    assert await store.runs("acme") == 256
    still = await refresh(env, "billing export", turn_id="run-0")
    assert still.from_ledger  # 256 runs: run-0 is still remembered
    await store.reserve("acme", "ana", "run-256", "k", 3, 256, clock.now())
    assert await store.runs("acme") == 256
    forgotten = await refresh(env, "billing export", turn_id="run-0")
    assert not forgotten.from_ledger and forgotten.refreshes_spent == 1  # evicted: a fresh start
    await store.reserve("other", "ana", "run-x", "k", 3, 256, clock.now())
    assert await store.runs("other") == 1 and await store.runs("acme") == 256


async def test_other_seats_starting_runs_never_evict_a_running_turn_at_its_cap(env, clock):
    """The bound is per seat: 256 runs started across 40 other seats of the company (and 256 of
    another company) leave a seat's running turn at its cap refused. Per company, they evicted its
    row and the turn got three more refreshes."""
    store = env.service.deps.store
    await env.note("The billing export runs on Mondays.")
    for hint in ["billing export", "deploy pipeline", "holiday calendar"]:
        await refresh(env, hint, turn_id="long-run")
    for i in range(256):
        await store.reserve("acme", f"seat{i % 40}", f"other-{i}", "k", 3, 256, clock.now())
        await store.reserve("other", "ana", f"other-{i}", "k", 3, 256, clock.now())
    before = await filter_calls(env)
    code, info, _ = await refused(refresh(env, "fourth hint", turn_id="long-run"))
    assert (code.name, info.reason) == ("RESOURCE_EXHAUSTED", "REFRESH_LIMIT_REACHED")
    assert await filter_calls(env) == before
    assert (await refresh(env, "billing export", turn_id="long-run")).from_ledger


async def test_a_hint_is_required_and_a_negative_limit_refused(env):
    code, info, bad = await refused(refresh(env, "  "))
    assert (code.name, info.reason, bad.field_violations[0].field) == (
        "INVALID_ARGUMENT",
        "FIELD_REQUIRED",
        "context_hint",
    )
    code, info, _ = await refused(refresh(env, "x", limit=-1))
    assert info.reason == "LIMIT_OUT_OF_RANGE"


async def test_parallel_refreshes_of_one_hint_spend_one_slot_and_one_model_call(env):
    """A model may call tools in parallel: the same hint twice at once is one refresh (the second is
    answered from the ledger), one model call, and one use of the note."""
    import asyncio

    note = await env.note("The billing export runs on Mondays.")
    first, second = await asyncio.gather(refresh(env, "billing export"), refresh(env, "billing export"))
    assert sorted([first.from_ledger, second.from_ledger]) == [False, True]
    assert first.refreshes_spent == second.refreshes_spent == 1
    assert await filter_calls(env) == 1
    assert await env.uses(note) == 1


async def test_at_the_budget_ceiling_no_filter_is_asked_and_the_diary_ranks_the_notes(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    """Spec ("What the auxiliary calls cost"): an in-turn call goes through the turn's meter, and
    none is made while it holds a full window. refresh_memory asked the filter model each time (a
    seat 1,000 tokens over a 100 ceiling spent 1,020 more on three refreshes); it now answers
    without the model: the diary's own best matches, ranked by the offline rule, and says so."""
    scripted_openai.chat_handler = select_containing("billing")
    budget = {"seat_ceiling_tokens": 100, "window_hours": 24}
    settings = llm_settings(
        make_settings, scripted_openai, companies={"acme": {"roles": ROLES, "token_budget": budget}}
    )
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        note = await env.note("The billing export runs on Mondays.")
        cfg = settings.company("acme").token_budget
        await env.app.infra.budget.charge("acme", "ana", 1000, clock.now(), cfg)
        scripted_openai.clear()
        found = await refresh(env, "billing export", senders=[BOB])
        assert list(found.note_ids) == [note] and found.refreshes_spent == 1
        assert "token budget is spent" in found.text and "no model filtered" in found.text
        nothing = await refresh(env, "calendar invites")
        assert list(nothing.note_ids) == [] and nothing.refreshes_spent == 2
        assert scripted_openai.received("chat") == [] and await filter_calls(env) == 0
        room = await env.app.infra.budget.room("acme", "ana", clock.now(), cfg)
        assert room.seat_spent == 1000  # nothing more spent past the ceiling
