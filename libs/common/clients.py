"""Stubs of the services one service calls on another, over ``ServiceChannels``, with the deadline
every such call passes (``timeout=clients.timeout``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentlearn.diary.v1 import diary_service_pb2_grpc
from agentlearn.episodes.v1 import episode_service_pb2_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc
from agentlearn.profiles.v1 import profile_service_pb2_grpc
from agentlearn.reflector.v1 import reflector_service_pb2_grpc
from agentlearn.sessions.v1 import session_service_pb2_grpc
from agentlearn.skills.v1 import skill_service_pb2_grpc
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc
from libs.common.channels import ServiceChannels

_Stub = TypeVar("_Stub")

__all__ = ["Clients"]


@dataclass
class Clients:
    channels: ServiceChannels
    timeout: float
    """Deadline of each call, in seconds."""
    _stubs: dict[str, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _stub(self, name: str, cls: Callable[[Any], _Stub]) -> _Stub:
        """The stub of ``name`` on its current channel, built once per channel (a stub builds a
        callable per method: on every call that was measurable on the turn-start path)."""
        channel = self.channels.channel(name)
        held = self._stubs.get(name)
        if held is None or held[0] is not channel:
            held = (channel, cls(channel))
            self._stubs[name] = held
        stub: _Stub = held[1]
        return stub

    @property
    def diary(self) -> diary_service_pb2_grpc.DiaryServiceStub:
        return self._stub("diary", diary_service_pb2_grpc.DiaryServiceStub)

    @property
    def episodes(self) -> episode_service_pb2_grpc.EpisodeServiceStub:
        return self._stub("episodes", episode_service_pb2_grpc.EpisodeServiceStub)

    @property
    def skills(self) -> skill_service_pb2_grpc.SkillServiceStub:
        return self._stub("skills", skill_service_pb2_grpc.SkillServiceStub)

    @property
    def profiles(self) -> profile_service_pb2_grpc.ProfileServiceStub:
        return self._stub("profiles", profile_service_pb2_grpc.ProfileServiceStub)

    @property
    def knowledge(self) -> knowledge_service_pb2_grpc.KnowledgeServiceStub:
        """The knowledge service (agentlearn.knowledge.v1)."""
        return self._stub("knowledge", knowledge_service_pb2_grpc.KnowledgeServiceStub)

    @property
    def sessions(self) -> session_service_pb2_grpc.SessionServiceStub:
        return self._stub("sessions", session_service_pb2_grpc.SessionServiceStub)

    @property
    def reflector(self) -> reflector_service_pb2_grpc.ReflectorServiceStub:
        return self._stub("reflector", reflector_service_pb2_grpc.ReflectorServiceStub)

    @property
    def telemetry(self) -> telemetry_service_pb2_grpc.TelemetryServiceStub:
        return self._stub("telemetry", telemetry_service_pb2_grpc.TelemetryServiceStub)

    @property
    def prefetch(self) -> prefetch_service_pb2_grpc.PrefetchServiceStub:
        """The prefetch (agentlearn.prefetch.v1.PrefetchService): the privacy service's erasures."""
        return self._stub("prefetch", prefetch_service_pb2_grpc.PrefetchServiceStub)
