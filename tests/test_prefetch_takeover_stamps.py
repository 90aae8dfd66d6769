"""A turn-start build taken over as stale (slow, not dead) freezes nothing and answers with the
taker's context — and stamps nothing: the notes it selected are not marked used and the skills it
offered are not stamped offered, since its context is never shown. It used to stamp both during its
build, so a taken-over run counted its note uses and skill offers twice. Real services over gRPC,
the real prefetch store on the embedded PostgreSQL, a scripted model that holds the slow build."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from tests.support.scripted_openai import Reply
from tests.test_prefetch_support import llm_settings, open_env, purpose_of

ASK = "Can you send Bob the weekly billing export digest?"
WAIT = 30.0  # a bound on what should take a second: a hang fails the test instead of hanging it


async def test_a_slow_builder_taken_over_stamps_no_note_use_and_no_skill_offer(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    filters: list[dict[str, Any]] = []

    def hold_the_first_filter(body: dict[str, Any]) -> Reply | None:
        # The first build's memory filter is held open (a slow model) until the taker is done.
        if purpose_of(body) != "memory_filter":
            return None
        filters.append(body)
        return Reply(hold=release) if len(filters) == 1 else None

    scripted_openai.rule("chat", hold_the_first_filter)
    scripted_openai.chat_handler = lambda body: (
        json.dumps({"selected": ["n1"]}) if purpose_of(body) == "memory_filter" else "billing export digest"
    )
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        digest = await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
        await env.skill("billing-digest", "Export billing and post the weekly digest to the requester")
        skills = env.app.components["skills"].service
        offers: list[tuple[Any, ...]] = []
        mark_offered = skills.mark_offered

        async def counted(*args: Any, **kwargs: Any) -> Any:
            offers.append(args)
            return await mark_offered(*args, **kwargs)

        monkeypatch.setattr(skills, "mark_offered", counted)

        slow = asyncio.create_task(env.build(ASK, turn_id="run-1"))
        try:
            async with asyncio.timeout(WAIT):
                while scripted_openai.held < 1:  # the first build is waiting on its filter
                    await asyncio.sleep(0.01)
            clock.advance(seconds=env.service.turn_context._claim_seconds() + 1)  # its claim looks dead
            async with asyncio.timeout(WAIT):
                taker = await env.build(ASK, turn_id="run-1")
            taker_stamped = (await env.uses(digest), len(offers))
        finally:
            release.set()
        async with asyncio.timeout(WAIT):
            late = await slow

        assert taker_stamped == (1, 1)  # the taker's own stamps, before it answered
        assert late == taker  # the slow build answers with the context frozen by its taker
        assert len(filters) == 2  # both builds ran their filter, and selected the note
        assert await env.uses(digest) == 1  # the use of the context shown, once
        assert len(offers) == 1  # the offer of the context shown, once
        assert len(await env.events("prefetch_summary")) == 1
