"""Stubs of the services one service calls on another, over ``ServiceChannels``, with the deadline
every such call passes (``timeout=clients.timeout``)."""

from __future__ import annotations

from dataclasses import dataclass

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

__all__ = ["Clients"]


@dataclass
class Clients:
    channels: ServiceChannels
    timeout: float
    """Deadline of each call, in seconds."""

    @property
    def diary(self) -> diary_service_pb2_grpc.DiaryServiceStub:
        return diary_service_pb2_grpc.DiaryServiceStub(self.channels.channel("diary"))

    @property
    def episodes(self) -> episode_service_pb2_grpc.EpisodeServiceStub:
        return episode_service_pb2_grpc.EpisodeServiceStub(self.channels.channel("episodes"))

    @property
    def skills(self) -> skill_service_pb2_grpc.SkillServiceStub:
        return skill_service_pb2_grpc.SkillServiceStub(self.channels.channel("skills"))

    @property
    def profiles(self) -> profile_service_pb2_grpc.ProfileServiceStub:
        return profile_service_pb2_grpc.ProfileServiceStub(self.channels.channel("profiles"))

    @property
    def knowledge(self) -> knowledge_service_pb2_grpc.KnowledgeServiceStub:
        """The knowledge service (agentlearn.knowledge.v1)."""
        return knowledge_service_pb2_grpc.KnowledgeServiceStub(self.channels.channel("knowledge"))

    @property
    def sessions(self) -> session_service_pb2_grpc.SessionServiceStub:
        return session_service_pb2_grpc.SessionServiceStub(self.channels.channel("sessions"))

    @property
    def reflector(self) -> reflector_service_pb2_grpc.ReflectorServiceStub:
        return reflector_service_pb2_grpc.ReflectorServiceStub(self.channels.channel("reflector"))

    @property
    def telemetry(self) -> telemetry_service_pb2_grpc.TelemetryServiceStub:
        return telemetry_service_pb2_grpc.TelemetryServiceStub(self.channels.channel("telemetry"))

    @property
    def prefetch(self) -> prefetch_service_pb2_grpc.PrefetchServiceStub:
        """The prefetch (agentlearn.prefetch.v1.PrefetchService): the privacy service's erasures."""
        return prefetch_service_pb2_grpc.PrefetchServiceStub(self.channels.channel("prefetch"))
