"""Erasing one person however the request and the rows spell her (issue 17): a platform compared
case-insensitively everywhere; her handle and her external id one person, never "another person" to
each other; rows resting on her alone deleted, not kept as shared; promotion drafts that name her;
a redelivered turn of hers after the erasure. Each test was written against a residue an erasure
reported SUCCEEDED over.

Real parts, as tests/test_privacy.py: the services on a loopback gRPC server, Postgres, the embedded
vector index, the local embedding model, the reflector's workers on the offline model rules, and the
privacy service's erasure worker.
"""

from __future__ import annotations

import asyncpg
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from tests.support.app import open_app
from tests.support.turns import turn
from tests.test_privacy import NAMES, Env, _mentions

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):  # type: ignore[no-untyped-def]
    # As tests/test_privacy.py's; reflection records and their jobs kept 30 days (the retention
    # prune is run by hand where a test needs the turn's payload gone).
    settings = make_settings(
        companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}},
        privacy={"companies": {"acme": {"reflection_max_age_days": 30}}},
    )
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        yield Env(app)


EXTERNAL = "U07XK9Q2"
"""Carla's Slack user id (the engine sends it with her handle)."""


def _from_carla(body: str, platform: str = "Slack") -> rf_pb.InboundInteraction:
    """A message of Carla's as an engine reports it: her handle, her user id, its own spelling of
    the platform."""
    sender = rf_pb.Sender(handle="carla", external_id=EXTERNAL, platform=platform, display_name="Carla")
    return rf_pb.InboundInteraction(sender=sender, body=body)


async def _submit(env: Env, clock, run: str, *messages: rf_pb.InboundInteraction, drain: bool = True) -> None:  # type: ignore[no-untyped-def]
    await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=turn(run, now=clock.now(), messages=list(messages))))
    if drain:
        await env.harness.drain()
    clock.advance(seconds=60)


async def _erase(env: Env, subject: er.ErasureSubject, names: tuple[str, ...] = ()) -> pv.Erasure:
    resp = await env.privacy.EraseSubject(pv.EraseSubjectRequest(company="acme", subject=subject, names=list(names)))
    await env.worker.drain()
    return (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure


async def _rows(dsn: str, sql: str, *args: object) -> list[dict]:  # type: ignore[type-arg]
    conn = await asyncpg.connect(dsn)
    try:
        return [dict(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def test_her_profile_goes_whatever_the_case_of_the_platform_the_request_names(env, dsn, clock):
    """The profiles file the platform lowercased; a request spelling it "Slack" erased every other
    row of hers and kept her profile (taken for another person's resting on her)."""
    await _submit(env, clock, "run-b1", _from_carla("I prefer the billing export in euros.", platform="slack"))
    assert await _rows(dsn, "SELECT id FROM counterparty_profiles WHERE subject_handle = 'carla'")

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="Slack"))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert await _rows(dsn, "SELECT id, platform FROM counterparty_profiles") == []
    for word in ("carla", EXTERNAL, "euros"):
        assert await _mentions(dsn, word) == {}, word
