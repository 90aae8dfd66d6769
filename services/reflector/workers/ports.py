"""The calls the reflector's workers make on other services, as ports, and their gRPC adapters.

A worker decides (gate, prompt, parse, what to write) and then calls one of these: the diary, the
episodes, the skills (and the profiles, for the profiler once it moves off its stub). The ports
speak the services' own request and response messages, so the contract is the proto's and nothing
is restated; the adapters add the deadline every call between services passes. A failure is the
callee's status (``grpc.aio.AioRpcError``), as over the wire: ``failure_kind`` classifies it and a
fake raises the same (``libs.common.grpcserver.rpc_error``). The unit tier runs the workers on
in-memory fakes of these (tests/unit/fakes/reflector.py), the integration tier on real servers.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.clients import Clients

__all__ = [
    "DiaryPort",
    "EpisodesPort",
    "GrpcDiary",
    "GrpcEpisodes",
    "GrpcProfiles",
    "GrpcSkills",
    "ProfilesPort",
    "SkillsPort",
    "WorkerPorts",
    "grpc_ports",
]


class DiaryPort(Protocol):
    async def recall_notes(self, request: diary_pb.RecallNotesRequest) -> diary_pb.RecallNotesResponse: ...

    async def write_note(self, request: diary_pb.WriteNoteRequest) -> diary_pb.WriteNoteResponse:
        """Idempotent on ``request_id``."""
        ...


class EpisodesPort(Protocol):
    async def record_episode(self, request: ep_pb.RecordEpisodeRequest) -> ep_pb.RecordEpisodeResponse:
        """Idempotent on the run id; ``collapsed`` when the work key already has a row."""
        ...

    async def mark_consolidated(
        self, request: ep_pb.MarkEpisodesConsolidatedRequest
    ) -> ep_pb.MarkEpisodesConsolidatedResponse: ...


class SkillsPort(Protocol):
    async def list_skills(self, request: sk_pb.ListSkillsRequest) -> sk_pb.ListSkillsResponse: ...

    async def get_skill(self, request: sk_pb.GetSkillRequest) -> sk_pb.GetSkillResponse: ...

    async def check_candidate(self, request: sk_pb.CheckSkillCandidateRequest) -> sk_pb.CheckSkillCandidateResponse: ...

    async def create_skill(self, request: sk_pb.CreateSkillRequest) -> sk_pb.CreateSkillResponse:
        """ALREADY_EXISTS (a status) when the name is taken."""
        ...

    async def append_observation(
        self, request: sk_pb.AppendSkillObservationRequest
    ) -> sk_pb.AppendSkillObservationResponse: ...

    async def mark_used(self, request: sk_pb.MarkSkillsUsedRequest) -> sk_pb.MarkSkillsUsedResponse: ...


class ProfilesPort(Protocol):
    async def upsert_profile(self, request: pr_pb.UpsertProfileRequest) -> pr_pb.UpsertProfileResponse: ...

    async def get_profiles(self, request: pr_pb.GetProfilesRequest) -> pr_pb.GetProfilesResponse: ...


@dataclass(frozen=True)
class WorkerPorts:
    diary: DiaryPort
    episodes: EpisodesPort
    skills: SkillsPort
    profiles: ProfilesPort


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class _OverClients:
    """A port's adapter over ``Clients`` (in-process in the all-in-one, the wire otherwise)."""

    def __init__(self, clients: Clients):
        self._clients = clients


def _forward(
    rpc: Callable[[Clients], grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp]],
) -> Callable[[_OverClients, _Req], Coroutine[Any, Any, _Resp]]:
    """A port method that is one call of ``rpc`` (picked from the process's clients) with the
    deadline every call between services passes. Typed end to end: an adapter whose method forwards
    to an RPC of other messages does not satisfy its port."""

    async def call(self: _OverClients, request: _Req) -> _Resp:
        return await rpc(self._clients)(request, timeout=self._clients.timeout)

    return call


class GrpcDiary(_OverClients):
    recall_notes = _forward(lambda clients: clients.diary.RecallNotes)
    write_note = _forward(lambda clients: clients.diary.WriteNote)


class GrpcEpisodes(_OverClients):
    record_episode = _forward(lambda clients: clients.episodes.RecordEpisode)
    mark_consolidated = _forward(lambda clients: clients.episodes.MarkEpisodesConsolidated)


class GrpcSkills(_OverClients):
    list_skills = _forward(lambda clients: clients.skills.ListSkills)
    get_skill = _forward(lambda clients: clients.skills.GetSkill)
    check_candidate = _forward(lambda clients: clients.skills.CheckSkillCandidate)
    create_skill = _forward(lambda clients: clients.skills.CreateSkill)
    append_observation = _forward(lambda clients: clients.skills.AppendSkillObservation)
    mark_used = _forward(lambda clients: clients.skills.MarkSkillsUsed)


class GrpcProfiles(_OverClients):
    upsert_profile = _forward(lambda clients: clients.profiles.UpsertProfile)
    get_profiles = _forward(lambda clients: clients.profiles.GetProfiles)


def grpc_ports(clients: Clients) -> WorkerPorts:
    """The workers' ports over the process's service clients."""
    return WorkerPorts(GrpcDiary(clients), GrpcEpisodes(clients), GrpcSkills(clients), GrpcProfiles(clients))
