"""ExportSeat (issue 17, data portability): everything learned for a seat, as NDJSON, read through
each owner's own listing and provenance RPCs (the privacy service reads no other service's tables)
and streamed a page at a time, so an export of any size holds one page in memory (and the ids of
the sessions it exported and of their lessons, ``_sessions``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict

from agentlearn.diary.v1 import diary_service_pb2 as d_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.clients import Clients

__all__ = ["export_seat"]

PAGE = 200
SESSIONS_PAGE = 100
"""The sessions service's listings serve at most 100 a page."""
CONCURRENCY = 8
"""Provenance reads in flight at once: a page's rows are read together, not one after another,
without asking one owner for a whole page at once."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Provenance:
    """Where each listed row came from: the line ``kind``, the owner's Get*Provenance RPC, its
    request, and the request field naming the row (the line carries it beside the answer)."""

    kind: str
    rpc: Callable[[Clients], Callable[..., Awaitable[Any]]]
    request: Callable[..., Any]
    id_field: str


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
    provenance: _Provenance | None = None
    """Each row's provenance, as lines of its own after the row's page."""


_SOURCES = (
    _Source(
        "note",
        lambda clients: clients.diary.ListNotes,
        d_pb.ListNotesRequest,
        "notes",
        provenance=_Provenance(
            "note_provenance", lambda clients: clients.diary.GetNoteProvenance, d_pb.GetNoteProvenanceRequest, "note_id"
        ),
    ),
    _Source(
        "episode",
        lambda clients: clients.episodes.ListEpisodes,
        ep_pb.ListEpisodesRequest,
        "episodes",
        provenance=_Provenance(
            "episode_provenance",
            lambda clients: clients.episodes.GetEpisodeProvenance,
            ep_pb.GetEpisodeProvenanceRequest,
            "episode_id",
        ),
    ),
    _Source(
        "profile",
        lambda clients: clients.profiles.ListProfiles,
        pr_pb.ListProfilesRequest,
        "profiles",
        seat_field="observer",
        provenance=_Provenance(
            "profile_provenance",
            lambda clients: clients.profiles.GetProfileProvenance,
            pr_pb.GetProfileProvenanceRequest,
            "profile_id",
        ),
    ),
    _Source(
        "skill",
        lambda clients: clients.skills.ListSkills,
        sk_pb.ListSkillsRequest,
        "skills",
        extra={"include_archived": True, "view": sk_pb.SKILL_VIEW_FULL},
        provenance=_Provenance(
            "skill_provenance",
            lambda clients: clients.skills.GetSkillProvenance,
            sk_pb.GetSkillProvenanceRequest,
            "skill_id",
        ),
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
"""What the export holds of a seat's rows, in this order: notes, episodes, profiles, skills (full
bodies), skill proposals (their provenance is on them), reflection records; each page of notes,
episodes, profiles and skills followed by their provenance. The seat's sessions follow
(``_sessions``)."""


def _fields(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _line(kind: str, body: dict[str, Any]) -> str:
    # The resource under its kind's name: its own fields (an episode's "kind") never collide.
    return json.dumps({"kind": kind, kind: body}, sort_keys=True)


async def _found(call: Awaitable[Any]) -> Any | None:
    """The answer of a Get* call, or None when the row is gone (NOT_FOUND): a note expired, a row
    erased or a lesson removed between its listing and this read has nothing left to say; any
    other failure ends the export with its status."""
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def _bounded(calls: Sequence[Callable[[], Awaitable[_T]]]) -> list[_T]:
    """The answers of ``calls``, in their order, at most ``CONCURRENCY`` in flight. The first
    failure cancels the rest and is raised as it is (the owner's status ends the export)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Callable[[], Awaitable[_T]]) -> _T:
        async with gate:
            return await call()

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _provenance(clients: Clients, source: _Source, company: str, seat: str, rows: Iterable[Any]) -> list[str]:
    """The provenance line of each of ``rows``, in the rows' order (read ``CONCURRENCY`` at a time)."""
    prov = source.provenance
    assert prov is not None
    rpc = prov.rpc(clients)

    def read(row_id: str) -> Callable[[], Awaitable[Any | None]]:
        request = prov.request(company=company, **{source.seat_field: seat, prov.id_field: row_id})
        return lambda: _found(rpc(request, timeout=clients.timeout))

    ids = [row.id for row in rows]
    answers = await _bounded([read(row_id) for row_id in ids])
    return [
        _line(prov.kind, {prov.id_field: row_id, **_fields(resp)})
        for row_id, resp in zip(ids, answers, strict=True)
        if resp is not None
    ]


async def _pages(clients: Clients, source: _Source, company: str, seat: str) -> AsyncIterator[list[str]]:
    rpc = source.rpc(clients)
    token = ""
    while True:
        request = source.request(
            company=company, page_size=PAGE, page_token=token, **{source.seat_field: seat}, **source.extra
        )
        resp = await rpc(request, timeout=clients.timeout)
        rows = getattr(resp, source.items)
        if rows:
            yield [_line(source.kind, _fields(m)) for m in rows]
            if source.provenance is not None:
                lines = await _provenance(clients, source, company, seat, rows)
                if lines:
                    yield lines
        token = resp.next_page_token
        if not token:
            return


async def _checks(
    clients: Clients, company: str, session: ss_pb.SessionSummary, lessons: dict[str, None]
) -> AsyncIterator[list[str]]:
    """The session's learning checks (their receipts), a page at a time; the workspace lessons they
    wrote are added to ``lessons`` (their provenance is read once per export, ``_lessons``)."""
    token = ""
    while True:
        request = ss_pb.ListLearningChecksRequest(
            company=company,
            session_id=session.session_id,
            user=session.user,
            page_size=SESSIONS_PAGE,
            page_token=token,
        )
        resp = await clients.sessions.ListLearningChecks(request, timeout=clients.timeout)
        if resp.checks:
            yield [_line("learning_check", _fields(c)) for c in resp.checks]
        for check in resp.checks:
            lessons.update(dict.fromkeys(o.id for o in check.outputs if o.kind == ss_pb.OUTPUT_KIND_PROJECT_LESSON))
        token = resp.next_page_token
        if not token:
            return


async def _lessons(
    clients: Clients, company: str, lessons: Sequence[str], sessions: dict[str, int]
) -> AsyncIterator[list[str]]:
    """The provenance of each workspace lesson the exported sessions' checks wrote, read once per
    export (``CONCURRENCY`` lessons at a time) and split by session: one line per exported session
    among its sources, in the sessions' order, with that session's sources only. A workspace lesson
    is the workspace's: the sources other sessions (other seats' and users') taught it are theirs.

    ``GetLessonProvenance`` answers a lesson's every source, workspace-wide, unpaged (so at most
    ``CONCURRENCY`` answers are held at once): over the wire, a lesson taught by more checks than
    fit gRPC's 4 MB receive limit (thousands) ends the export with RESOURCE_EXHAUSTED; an
    in-process call has no such limit. Bounding it needs a paged or session-filtered read from the
    sessions service."""
    for start in range(0, len(lessons), CONCURRENCY):
        chunk = lessons[start : start + CONCURRENCY]

        def read(page_id: str) -> Callable[[], Awaitable[Any | None]]:
            asked = ss_pb.GetLessonProvenanceRequest(company=company, page_id=page_id)
            return lambda: _found(clients.sessions.GetLessonProvenance(asked, timeout=clients.timeout))

        lines = []
        for page_id, found in zip(chunk, await _bounded([read(p) for p in chunk]), strict=True):
            if found is None:
                continue
            own: dict[str, list[dict[str, Any]]] = {}
            for source in found.sources:
                if source.session_id in sessions:
                    own.setdefault(source.session_id, []).append(_fields(source))
            for session_id in sorted(own, key=sessions.__getitem__):
                body = {"page_id": page_id, "session_id": session_id, "workspace": found.workspace}
                lines.append(_line("lesson_provenance", {**body, "title": found.title, "sources": own[session_id]}))
        if lines:
            yield lines


async def _sessions(clients: Clients, company: str, seat: str, user: str | None) -> AsyncIterator[list[str]]:
    """The seat's sessions (as the sessions index lists them; a caller bound to a user: that user's
    only, as ``ListSessions`` shows it), each page followed by its sessions' learning checks; then
    the provenance of the workspace lessons those checks wrote (``_lessons``). The ids of the
    exported sessions and of their lessons are what the export keeps in memory past a page."""
    sessions: dict[str, int] = {}  # each exported session's position, to split a lesson's sources
    lessons: dict[str, None] = {}  # the lesson pages of the exported checks, in order, once each
    token = ""
    while True:
        request = ss_pb.ListSessionsRequest(
            company=company, seat=seat, user=user or "", page_size=SESSIONS_PAGE, page_token=token
        )
        resp = await clients.sessions.ListSessions(request, timeout=clients.timeout)
        if resp.sessions:
            yield [_line("session", _fields(s)) for s in resp.sessions]
        for session in resp.sessions:
            sessions.setdefault(session.session_id, len(sessions))
            async for lines in _checks(clients, company, session, lessons):
                yield lines
        token = resp.next_page_token
        if not token:
            break
    async for lines in _lessons(clients, company, list(lessons), sessions):
        yield lines


async def export_seat(clients: Clients, company: str, seat: str, user: str | None = None) -> AsyncIterator[list[str]]:
    """NDJSON lines of the seat, a page at a time (``_SOURCES``, in order, then ``_sessions``).

    ``user``: the user the caller is bound to (None: every user). The seat's own rows (notes,
    episodes, profiles, skills, proposals, reflections) are the seat's, and their listings show
    them to a token bound to the seat and a user alike, so they are exported whole; sessions, their
    checks and their share of lessons are a user's, and such a token gets that user's only, as the
    sessions service shows it (``ListSessions``, ``ListLearningChecks``)."""
    for source in _SOURCES:
        async for lines in _pages(clients, source, company, seat):
            yield lines
    async for lines in _sessions(clients, company, seat, user):
        yield lines
