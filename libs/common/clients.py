"""Stubs of the services one service calls on another, over ``ServiceChannels``, with the deadline
every such call passes (``timeout=clients.timeout``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

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


class _StubOf(Generic[_Stub]):
    """A read-only attribute of :class:`Clients`: the stub of the service named like the attribute,
    on its current channel (one descriptor instead of a property per service)."""

    def __init__(self, cls: Callable[[Any], _Stub]) -> None:
        self._cls = cls
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Clients, owner: type | None = None) -> _Stub:
        return obj._stub(self._name, self._cls)


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

    diary = _StubOf(diary_service_pb2_grpc.DiaryServiceStub)
    episodes = _StubOf(episode_service_pb2_grpc.EpisodeServiceStub)
    skills = _StubOf(skill_service_pb2_grpc.SkillServiceStub)
    profiles = _StubOf(profile_service_pb2_grpc.ProfileServiceStub)
    knowledge = _StubOf(knowledge_service_pb2_grpc.KnowledgeServiceStub)
    """The knowledge service (agentlearn.knowledge.v1)."""
    sessions = _StubOf(session_service_pb2_grpc.SessionServiceStub)
    reflector = _StubOf(reflector_service_pb2_grpc.ReflectorServiceStub)
    telemetry = _StubOf(telemetry_service_pb2_grpc.TelemetryServiceStub)
    prefetch = _StubOf(prefetch_service_pb2_grpc.PrefetchServiceStub)
    """The prefetch (agentlearn.prefetch.v1.PrefetchService): the privacy service's erasures."""
