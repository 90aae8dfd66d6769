"""A turn-start build that settles while its claim is young — too young for anyone to have taken
it over — stamps its note uses and skill offers beside its context's save rather than after it:
the save cannot fail to land, so waiting for it first only added a round trip to the turn start.
The slow build taken over is tests/test_prefetch_takeover_stamps.py. Real services over gRPC, the
real prefetch store on the embedded PostgreSQL, a scripted model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.test_prefetch_support import llm_settings, open_env, purpose_of

ASK = "Can you send Bob the weekly billing export digest?"
WAIT = 10.0  # a bound on what should take well under a second: stamps never started fail the test


async def test_a_young_claims_stamps_are_written_while_its_save_is_in_flight(
    make_settings: Any,
    dsn: str,
    clock: Any,
    local_embedder: Any,
    edge_index: Any,
    scripted_openai: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted_openai.chat_handler = lambda body: (
        json.dumps({"selected": ["n1"]}) if purpose_of(body) == "memory_filter" else "billing export digest"
    )
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        digest = await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
        await env.skill("billing-digest", "Export billing and post the weekly digest to the requester")
        used, offered = asyncio.Event(), asyncio.Event()
        diary = env.app.components["diary"].service
        skills = env.app.components["skills"].service
        mark_used, mark_offered = diary.mark_used, skills.mark_offered

        async def use(*args: Any, **kwargs: Any) -> Any:
            used.set()
            return await mark_used(*args, **kwargs)

        async def offer(*args: Any, **kwargs: Any) -> Any:
            offered.set()
            return await mark_offered(*args, **kwargs)

        monkeypatch.setattr(diary, "mark_used", use)
        monkeypatch.setattr(skills, "mark_offered", offer)
        store = env.service.turn_context.deps.store
        save_context = store.save_context
        seen_in_flight: list[bool] = []

        async def held_save(*args: Any, **kwargs: Any) -> Any:
            # The save waits (bounded) for both stamps to reach their services: it lands only if
            # they were issued beside it, not after it.
            try:
                async with asyncio.timeout(WAIT):
                    await used.wait()
                    await offered.wait()
                seen_in_flight.append(True)
            except TimeoutError:
                seen_in_flight.append(False)
            return await save_context(*args, **kwargs)

        monkeypatch.setattr(store, "save_context", held_save)
        await env.build(ASK, turn_id="run-1")

        assert seen_in_flight == [True]  # both stamps were on their way while the save was
        assert await env.uses(digest) == 1  # and written once, the context being the one shown
        assert len(await env.events("prefetch_summary")) == 1
