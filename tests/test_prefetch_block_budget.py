"""BuildTurnContext answers within one budget per block (the ask's embed, one read and the
auxiliary model's deadline): a source that never answers degrades its block (DEADLINE_EXCEEDED in
its source_error) and the other blocks stand. Before, each step had its own deadline but a block's
steps ran in a row, and a knowledge seam that did not answer held the whole turn start. Real
services over gRPC; the knowledge seam is wrapped so its can_search never returns."""

from __future__ import annotations

import asyncio

import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from tests.test_prefetch_support import default_settings, open_env

# Budget: 1 s embed + 1 s auxiliary model + one read's 10 s.
FAST = {"prefetch": {"embed_budget_seconds": 1.0, "aux_timeout_seconds": 1.0}}


class SilentSearcher:
    """The real seam, except that can_search waits for ``release`` (set when the test ends)."""

    def __init__(self, inner, release: asyncio.Event):  # type: ignore[no-untyped-def]
        self._inner, self.release, self.asked = inner, release, 0

    async def can_search(self, reader):  # type: ignore[no-untyped-def]
        self.asked += 1
        await self.release.wait()
        return await self._inner.can_search(reader)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._inner, name)


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    settings = default_settings(make_settings, learning=FAST)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


async def test_a_block_whose_source_never_answers_degrades_and_the_turn_start_answers(env):
    await env.skill("billing-digest", "Export billing and post the digest")
    deps = env.service.deps
    release = asyncio.Event()
    silent = SilentSearcher(deps.searcher, release)
    deps.searcher = silent
    try:
        # The engine's deadline is far past the block budget (12 s): the answer must come from the
        # budget, not from the deadline (which would be DEADLINE_EXCEEDED for the whole call).
        resp = await env.prefetch.BuildTurnContext(
            pb.BuildTurnContextRequest(
                company="acme", seat="ana", turn_id="turn-1", role="swe", ask="send bob the weekly billing export"
            ),
            timeout=60,
        )
    finally:
        release.set()
    assert silent.asked == 1
    summary = {b.block: b for b in resp.summary.blocks}
    assert summary[pb.BLOCK_RELEVANT_KNOWLEDGE].source_error == "knowledge: DEADLINE_EXCEEDED"
    skills = [b for b in resp.blocks if b.block == pb.BLOCK_SKILLS]
    assert skills and "billing-digest" in skills[0].markdown  # the other blocks stand
    assert not summary[pb.BLOCK_SKILLS].source_error
