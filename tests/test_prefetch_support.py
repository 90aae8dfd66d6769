"""What the prefetch tests share (no tests here): every service the prefetch reads served for real
over gRPC, a counting embedder, a scripted auxiliary model that answers each purpose, and helpers
that write notes, turns, skills, profiles and pages through the owning services' own RPCs."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kn_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as prof_grpc
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as skill_grpc
from libs.common.events import read_events
from tests.support.app import App, open_app
from tests.support.embedders import DelegatingEmbedder
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import openai_provider
from tests.support.skills import create_skill
from tests.support.turns import raw_episode

__all__ = ["SERVICES", "CountingEmbedder", "Env", "counting_env", "llm_settings", "open_env", "purpose_of", "refused"]

SERVICES = ["diary", "episodes", "skills", "profiles", "knowledge", "prefetch"]
ROLES = {"swe": {"knowledge_containers": ["eng"], "unit": "platform"}, "intern": {}}


async def refused(call) -> tuple:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return error_info(exc.value)


class CountingEmbedder(DelegatingEmbedder):
    """An embedder that records every text it is asked to embed (and can be told to fail)."""

    def __init__(self, inner: Any, fail: Exception | None = None):
        super().__init__(inner)
        self.texts: list[str] = []
        self.fail = fail

    async def embed(self, texts: Sequence[str]) -> list[Any]:
        self.texts.extend(texts)
        if self.fail is not None:
            raise self.fail
        return await self._inner.embed(texts)


def llm_settings(make_settings, server, *, timeout: float = 10.0, **extra):  # type: ignore[no-untyped-def]
    """Settings whose only auxiliary provider is the scripted OpenAI-compatible server."""
    providers = {
        "llm": {"scripted": openai_provider(server, "small", timeout_seconds=timeout)},
        "auxiliary_chain": ["scripted"],
    }
    extra.setdefault("companies", {"acme": {"roles": ROLES}})
    return make_settings(providers=providers, **extra)


def default_settings(make_settings, **extra):  # type: ignore[no-untyped-def]
    extra.setdefault("companies", {"acme": {"roles": ROLES}})
    return make_settings(**extra)


def purpose_of(body: dict) -> str:
    """Which prefetch prompt a scripted chat request is (read from its system message)."""
    system = next((m["content"] for m in body.get("messages", []) if m["role"] == "system"), "")
    if "private diary" in system:
        return "memory_filter"
    if "keyword query" in system:
        return "knowledge_query"
    if "You brief an AI agent" in system:
        return "episode_summary"
    if "You condense one text" in system:
        return "episode_rewrite"
    return "other"


def user_of(body: dict) -> str:
    return next((m["content"] for m in body.get("messages", []) if m["role"] == "user"), "")


def listed_notes(body: dict) -> dict[str, str]:
    """The filter prompt's candidates: short id -> content."""
    return dict(re.findall(r"^\[(n\d+)\] \([^)]*\) (.*)$", user_of(body), flags=re.M))


def select_containing(word: str, *extra_ids: str):  # type: ignore[no-untyped-def]
    """A scripted memory filter choosing the notes that contain ``word`` (plus ``extra_ids``)."""

    def choose(body: dict) -> str:
        chosen = [k for k, v in listed_notes(body).items() if word.lower() in v.lower()]
        return json.dumps({"selected": chosen + list(extra_ids)})

    return choose


class Env:
    def __init__(self, app: App, clock):  # type: ignore[no-untyped-def]
        self.app, self.clock = app, clock
        ch = app.channel
        self.prefetch = pb_grpc.PrefetchServiceStub(ch)
        self.builtins = pb_grpc.BuiltinServiceStub(ch)
        self.diary = diary_grpc.DiaryServiceStub(ch)
        self.episodes = ep_grpc.EpisodeServiceStub(ch)
        self.skills = skill_grpc.SkillServiceStub(ch)
        self.profiles = prof_grpc.ProfileServiceStub(ch)
        self.knowledge = kn_grpc.KnowledgeServiceStub(ch)
        self._turns = 0

    @property
    def service(self):  # type: ignore[no-untyped-def]
        return self.app.components["prefetch"].service

    # ------------------------------------------------------------------ writing through the owners

    async def note(self, content: str, *, seat: str = "ana", ttl_days: int = 0) -> str:
        self.clock.advance(seconds=1)
        tier = diary_pb.NOTE_TIER_SHORT if ttl_days else diary_pb.NOTE_TIER_LONG
        resp = await self.diary.WriteNote(
            diary_pb.WriteNoteRequest(company="acme", seat=seat, content=content, tier=tier, ttl_days=ttl_days)
        )
        return resp.note.id

    async def uses(self, note_id: str, seat: str = "ana") -> int:
        resp = await self.diary.GetNote(diary_pb.GetNoteRequest(company="acme", seat=seat, note_id=note_id))
        return resp.note.use_count

    async def turn(
        self,
        label: str,
        ask: str = "",
        what: str = "Done.",
        *,
        seat: str = "ana",
        outcome: int = ep_pb.TURN_OUTCOME_DONE,
        tools: Sequence[str] = ("jira.search",),
        final_round: Sequence[str] | None = None,
        days_ago: float = 0.0,
        conversation: str = "",
    ) -> ep_pb.Episode:
        """``tools``: every call the turn made; ``final_round``: its last round (the last call)."""
        self._turns += 1
        self.clock.advance(seconds=1)
        end = self.clock.now() - timedelta(days=days_ago)
        turn_id = f"run-{self._turns}-{uuid.uuid4().hex[:8]}"
        last_round = tools[-1:] if final_round is None else final_round
        request = raw_episode(
            seat,
            turn_id,
            end,
            label,
            ask,
            what,
            last_round,
            outcome,
            minutes=2,
            tools_called=list(tools),
            conversation_id=conversation,
        )
        return (await self.episodes.RecordEpisode(request)).episode

    async def skill(self, name: str, summary: str, *, seat: str = "ana", tools: Sequence[str] = ()) -> skill_pb.Skill:
        self.clock.advance(seconds=1)
        body = f"# {name}\n\n1. {summary}\n"
        return await create_skill(
            self.skills, name, list(tools) or [f"{name}.tool"], seat=seat, summary=summary, body=body
        )

    async def profile(
        self, handle: str = "bob", *, observer: str = "ana", platform: str = "slack", **fields: Any
    ) -> prof_pb.Profile:
        fields.setdefault("communication_style", "Terse; wants bullet points.")
        resp = await self.profiles.UpsertProfile(
            prof_pb.UpsertProfileRequest(
                company="acme", observer=observer, subject=prof_pb.Subject(handle=handle, platform=platform), **fields
            )
        )
        return resp.profile

    async def page(self, container: str, title: str, body: str, parents: Sequence[str] = ()) -> kn_pb.Page:
        resp = await self.knowledge.UpsertPage(
            kn_pb.UpsertPageRequest(
                company="acme", container=container, title=title, body=body, parent_titles=list(parents)
            )
        )
        return resp.page

    # ------------------------------------------------------------------ reading

    async def build(self, ask: str, *, turn_id: str | None = None, **kw: Any) -> pb.BuildTurnContextResponse:
        """A turn start; each call is a new run (turn-1, turn-2, ...) unless ``turn_id`` names one:
        a run's context is frozen, so a second call for the same run id answers the first's."""
        if turn_id is None:
            self._runs = getattr(self, "_runs", 0) + 1
            turn_id = f"turn-{self._runs}"
        kw.setdefault("role", "swe")
        return await self.prefetch.BuildTurnContext(
            pb.BuildTurnContextRequest(company="acme", seat="ana", turn_id=turn_id, ask=ask, **kw)
        )

    async def events(self, kind: str) -> list[dict]:
        return [dict(e) for e in await read_events(self.app.infra.pool, kind)]


def block(resp: pb.BuildTurnContextResponse, kind: int) -> pb.RenderedBlock:
    [found] = [b for b in resp.blocks if b.block == kind]
    return found


@contextlib.asynccontextmanager
async def open_env(settings, dsn, clock, *, embedder, index, names=None) -> AsyncIterator[Env]:  # type: ignore[no-untyped-def]
    async with open_app(settings, dsn, names=names or SERVICES, clock=clock, embedder=embedder, index=index) as app:
        yield Env(app, clock)


@contextlib.asynccontextmanager
async def counting_env(make_settings, dsn, clock, local_embedder, edge_index) -> AsyncIterator[Env]:  # type: ignore[no-untyped-def]
    """:func:`open_env` with the default settings and a :class:`CountingEmbedder` over the local
    model, as ``env.embedder``: the texts a turn start embeds are there to count."""
    embedder = CountingEmbedder(local_embedder)
    async with open_env(default_settings(make_settings), dsn, clock, embedder=embedder, index=edge_index) as e:
        e.embedder = embedder
        yield e
