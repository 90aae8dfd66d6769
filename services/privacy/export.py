"""ExportSeat (issue 17, data portability): everything learned for a seat, as NDJSON, read through
each owner's own listing RPCs (the privacy service reads no other service's tables) and streamed a
page at a time, so an export of any size holds one page in memory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf.json_format import MessageToDict

from agentlearn.diary.v1 import diary_service_pb2 as d_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.clients import Clients

__all__ = ["export_seat"]

PAGE = 200


def _line(kind: str, message: Any) -> str:
    # The resource under its kind's name: its own fields (an episode's "kind") never collide.
    return json.dumps({"kind": kind, kind: MessageToDict(message, preserving_proto_field_name=True)}, sort_keys=True)


async def _pages(
    call: Callable[[str], Awaitable[Any]], items: Callable[[Any], list[Any]], kind: str
) -> AsyncIterator[list[str]]:
    token = ""
    while True:
        resp = await call(token)
        lines = [_line(kind, m) for m in items(resp)]
        if lines:
            yield lines
        token = resp.next_page_token
        if not token:
            return


async def export_seat(clients: Clients, company: str, seat: str) -> AsyncIterator[list[str]]:
    """NDJSON lines of the seat, a page at a time: notes, episodes, profiles, skills (full bodies),
    skill proposals, reflection records."""
    t = clients.timeout

    async def notes(token: str) -> Any:
        req = d_pb.ListNotesRequest(company=company, seat=seat, page_size=PAGE, page_token=token)
        return await clients.diary.ListNotes(req, timeout=t)

    async def episodes(token: str) -> Any:
        req = ep_pb.ListEpisodesRequest(company=company, seat=seat, page_size=PAGE, page_token=token)
        return await clients.episodes.ListEpisodes(req, timeout=t)

    async def profiles(token: str) -> Any:
        req = pr_pb.ListProfilesRequest(company=company, observer=seat, page_size=PAGE, page_token=token)
        return await clients.profiles.ListProfiles(req, timeout=t)

    async def skills(token: str) -> Any:
        req = sk_pb.ListSkillsRequest(
            company=company,
            seat=seat,
            page_size=PAGE,
            page_token=token,
            include_archived=True,
            view=sk_pb.SKILL_VIEW_FULL,
        )
        return await clients.skills.ListSkills(req, timeout=t)

    async def proposals(token: str) -> Any:
        req = sk_pb.ListSkillProposalsRequest(company=company, seat=seat, page_size=PAGE, page_token=token)
        return await clients.skills.ListSkillProposals(req, timeout=t)

    async def reflections(token: str) -> Any:
        req = rf_pb.ListReflectionsRequest(company=company, seat=seat, page_size=PAGE, page_token=token)
        return await clients.reflector.ListReflections(req, timeout=t)

    sources: list[tuple[Callable[[str], Awaitable[Any]], Callable[[Any], list[Any]], str]] = [
        (notes, lambda r: list(r.notes), "note"),
        (episodes, lambda r: list(r.episodes), "episode"),
        (profiles, lambda r: list(r.profiles), "profile"),
        (skills, lambda r: list(r.skills), "skill"),
        (proposals, lambda r: list(r.proposals), "skill_proposal"),
        (reflections, lambda r: list(r.reflections), "reflection"),
    ]
    for call, items, kind in sources:
        async for lines in _pages(call, items, kind):
            yield lines
