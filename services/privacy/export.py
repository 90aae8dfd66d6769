"""ExportSeat (issue 17, data portability): everything learned for a seat, as NDJSON, read through
each owner's own listing RPCs (the privacy service reads no other service's tables) and streamed a
page at a time, so an export of any size holds one page in memory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class _Source:
    """One listing the export reads: the NDJSON lines' ``kind``, the owner's listing RPC, its
    request, the answer's repeated field, and how the request names the seat."""

    kind: str
    rpc: Callable[[Clients], Callable[..., Awaitable[Any]]]
    request: Callable[..., Any]
    items: str
    seat_field: str = "seat"
    extra: dict[str, Any] = field(default_factory=dict)
    """Further request fields (a skill's full body, the archived ones too)."""


_SOURCES = (
    _Source("note", lambda clients: clients.diary.ListNotes, d_pb.ListNotesRequest, "notes"),
    _Source("episode", lambda clients: clients.episodes.ListEpisodes, ep_pb.ListEpisodesRequest, "episodes"),
    _Source(
        "profile",
        lambda clients: clients.profiles.ListProfiles,
        pr_pb.ListProfilesRequest,
        "profiles",
        seat_field="observer",
    ),
    _Source(
        "skill",
        lambda clients: clients.skills.ListSkills,
        sk_pb.ListSkillsRequest,
        "skills",
        extra={"include_archived": True, "view": sk_pb.SKILL_VIEW_FULL},
    ),
    _Source(
        "skill_proposal",
        lambda clients: clients.skills.ListSkillProposals,
        sk_pb.ListSkillProposalsRequest,
        "proposals",
    ),
    _Source(
        "reflection",
        lambda clients: clients.reflector.ListReflections,
        rf_pb.ListReflectionsRequest,
        "reflections",
    ),
)
"""What the export holds of a seat, in this order: notes, episodes, profiles, skills (full
bodies), skill proposals, reflection records."""


def _line(kind: str, message: Any) -> str:
    # The resource under its kind's name: its own fields (an episode's "kind") never collide.
    return json.dumps({"kind": kind, kind: MessageToDict(message, preserving_proto_field_name=True)}, sort_keys=True)


async def _pages(clients: Clients, source: _Source, company: str, seat: str) -> AsyncIterator[list[str]]:
    rpc = source.rpc(clients)
    token = ""
    while True:
        request = source.request(
            company=company, page_size=PAGE, page_token=token, **{source.seat_field: seat}, **source.extra
        )
        resp = await rpc(request, timeout=clients.timeout)
        lines = [_line(source.kind, m) for m in getattr(resp, source.items)]
        if lines:
            yield lines
        token = resp.next_page_token
        if not token:
            return


async def export_seat(clients: Clients, company: str, seat: str) -> AsyncIterator[list[str]]:
    """NDJSON lines of the seat, a page at a time (``_SOURCES``, in order)."""
    for source in _SOURCES:
        async for lines in _pages(clients, source, company, seat):
            yield lines
