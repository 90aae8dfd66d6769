"""What the client and example tests share (no tests here): every service served for real on a
loopback port with the reflector's workers running (or split: the reflector on a port of its own,
as ``./run up --split`` and Kubernetes run it), a skill the seat can be offered, and waiting (with
a deadline) for a submitted turn to be reflected into its episode."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from libs.common.clock import SystemClock
from services.runner.registry import SERVICES
from tests.support.app import App, open_app
from tests.support.skills import skill_request
from tests.test_prefetch_support import default_settings

__all__ = [
    "offer_skill",
    "queued_reflection",
    "reflected_episode",
    "run_example",
    "serving",
    "serving_reflector",
    "serving_without_reflector",
]


@contextlib.asynccontextmanager
async def serving(make_settings, dsn, embedder, index, **kw) -> AsyncIterator[App]:  # type: ignore[no-untyped-def]
    """The whole system, as ``./run up`` runs it (the reflector's workers included)."""
    settings = default_settings(make_settings)
    async with open_app(settings, dsn, clock=SystemClock(), embedder=embedder, index=index, **kw) as app:
        workers = asyncio.create_task(app.components["reflector"].background[0]())
        try:
            yield app
        finally:
            workers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await workers


@contextlib.asynccontextmanager
async def serving_without_reflector(make_settings, dsn, embedder, index) -> AsyncIterator[App]:  # type: ignore[no-untyped-def]
    """Every service but the reflector, on one port (PrefetchService and BuiltinService among them):
    the front of a split deployment."""
    names = [n for n in SERVICES if n != "reflector"]
    settings = default_settings(make_settings)
    async with open_app(settings, dsn, names=names, clock=SystemClock(), embedder=embedder, index=index) as app:
        yield app


@contextlib.asynccontextmanager
async def serving_reflector(make_settings, dsn, address: str = "127.0.0.1:0") -> AsyncIterator[App]:  # type: ignore[no-untyped-def]
    """The reflector alone, on a port of its own (``address``); its workers do not run, so a
    submitted turn stays queued."""
    settings = default_settings(make_settings)
    async with open_app(settings, dsn, names=["reflector"], clock=SystemClock(), address=address) as app:
        yield app


async def queued_reflection(app: App, turn_id: str, seat: str = "ana") -> bool:
    """Whether ``turn_id`` is queued for reflection on ``app``'s reflector."""
    got = await rf_grpc.ReflectorServiceStub(app.channel).GetReflection(
        rf_pb.GetReflectionRequest(company="acme", seat=seat, turn_id=turn_id)
    )
    return got.reflection.state == rf_pb.REFLECTION_STATE_QUEUED


async def run_example(app: App, skill: sk_pb.Skill, program: list[str], turn_id: str, cwd: Path, *flags: str) -> str:
    """What a lifecycle example (``program``, run in ``cwd`` against ``app`` as turn ``turn_id``,
    with ``flags`` added) printed, once it exited cleanly and its last line (a JSON summary) says
    what every example does: the skill offered, the turn queued, the note it wrote refreshed, and
    the refusal of a bad tool call read off its rich status."""
    process = await asyncio.create_subprocess_exec(
        *program,
        "--address",
        f"127.0.0.1:{app.port}",
        "--turn-id",
        turn_id,
        *flags,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    text = out.decode()
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["offered_skills"] == [skill.id] and summary["queued"] is True
    assert summary["refresh_note_ids"] == [summary["note_id"]]
    assert summary["refusal"] == {
        "code": "INVALID_ARGUMENT",
        "reason": "TOOL_ARGUMENTS_INVALID",
        "fields": ["arguments_json.content"],
    }
    return text


async def offer_skill(app: App, seat: str = "ana") -> sk_pb.Skill:
    """A skill in the seat's catalogue: the turn-start skills block offers it."""
    name, summary = "prod-deploy-approval", "Get a prod deploy approved in #releases"
    body, tools = "# prod-deploy-approval\n\n1. Ask Dana in #releases.\n", ["slack_post", "slack_read"]
    resp = await sk_grpc.SkillServiceStub(app.channel).CreateSkill(
        skill_request(seat, name, summary, body, tools, ["seed"])
    )
    return resp.skill


async def reflected_episode(app: App, turn_id: str, seat: str = "ana", deadline: float = 90.0) -> ep_pb.Episode:
    """The episode the reflector wrote for ``turn_id``, once its reflection completed."""
    reflector = rf_grpc.ReflectorServiceStub(app.channel)
    until = time.monotonic() + deadline
    while True:
        got = await reflector.GetReflection(rf_pb.GetReflectionRequest(company="acme", seat=seat, turn_id=turn_id))
        if got.reflection.state == rf_pb.REFLECTION_STATE_COMPLETED:
            break
        assert time.monotonic() < until, f"turn {turn_id} not reflected: {got.reflection}"
        await asyncio.sleep(0.2)
    listed = await ep_grpc.EpisodeServiceStub(app.channel).ListEpisodes(
        ep_pb.ListEpisodesRequest(company="acme", seat=seat, page_size=50)
    )
    [episode] = [e for e in listed.episodes if e.turn_id == turn_id]
    return episode
