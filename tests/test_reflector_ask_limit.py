"""SubmitTurn's bound on what a turn was asked is the episode's ask as it is built (the non-empty
bodies joined one to a line), so a turn asked exactly the documented 100,000 characters is queued
and its episode keeps the ask whole. Real gRPC, real Postgres, the real episodist."""

from __future__ import annotations

import grpc
import pytest

from services.reflector.service import MAX_ASKED_CHARS
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.turns import message, turn
from tests.test_reflector_harness import Env

EPISODES_ONLY = {"reflection": {"workers": ["episodist"]}}


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):  # type: ignore[no-untyped-def]
    """the reflector with the episodist alone, and the episodes service it records through"""
    settings = make_settings(learning=EPISODES_ONLY)
    names = ["diary", "episodes", "reflector"]
    async with open_app(settings, dsn, names=names, clock=clock, embedder=local_embedder, index=edge_index) as app:
        yield Env(app)


@pytest.mark.parametrize(
    "bodies",
    [
        pytest.param(["a" * MAX_ASKED_CHARS], id="one body at the limit"),
        # 50,000 + "\n" + 49,999 = the limit; the empty body adds nothing to the ask.
        pytest.param(["a" * 50_000, "", "b" * (MAX_ASKED_CHARS - 50_001)], id="bodies joined to the limit"),
    ],
)
async def test_a_turn_asked_exactly_the_limit_is_queued_and_its_episode_keeps_the_ask(env, clock, bodies):
    t = turn("at-limit", now=clock.now(), messages=[message("bob", b) for b in bodies], tools=["read_log"])
    resp = await env.submit(t)
    assert resp.queued
    assert await env.harness.drain() == 1
    ask = await env.app.infra.pool.fetchval("SELECT ask FROM episodes WHERE turn_id = 'at-limit'")
    assert ask == "\n".join(b for b in bodies if b) and len(ask) == MAX_ASKED_CHARS


async def test_one_character_past_the_limit_is_refused_with_its_true_length(env, clock):
    bodies = [message("bob", "a" * 50_000), message("bob", "b" * (MAX_ASKED_CHARS - 50_000))]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.submit(turn("past-limit", now=clock.now(), messages=bodies))
    code, info, bad = error_info(err.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_TOO_LONG"
    assert info.metadata["length"] == str(MAX_ASKED_CHARS + 1)
    assert bad.field_violations[0].field == "turn.interactions"
    assert await env.app.infra.pool.fetchval("SELECT count(*) FROM reflections") == 0
