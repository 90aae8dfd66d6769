"""The owners an erasure asks, over their ``EraseRows`` / ``FindRows`` RPCs (each service erases
its own rows). A port, so the coordinator does not care where an owner runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from agentlearn.diary.v1 import diary_service_pb2, diary_service_pb2_grpc
from agentlearn.episodes.v1 import episode_service_pb2, episode_service_pb2_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2, knowledge_service_pb2_grpc
from agentlearn.profiles.v1 import profile_service_pb2, profile_service_pb2_grpc
from agentlearn.reflector.v1 import reflector_service_pb2, reflector_service_pb2_grpc
from agentlearn.sessions.v1 import session_service_pb2, session_service_pb2_grpc
from agentlearn.skills.v1 import skill_service_pb2, skill_service_pb2_grpc
from agentlearn.telemetry.v1 import telemetry_service_pb2, telemetry_service_pb2_grpc
from libs.common.erasure import Report, Target, report_from_proto, target_to_proto

__all__ = ["OWNER_STUBS", "GrpcOwners"]

OWNER_STUBS: dict[str, tuple[Any, Any]] = {
    "diary": (diary_service_pb2, diary_service_pb2_grpc.DiaryServiceStub),
    "episodes": (episode_service_pb2, episode_service_pb2_grpc.EpisodeServiceStub),
    "knowledge": (knowledge_service_pb2, knowledge_service_pb2_grpc.KnowledgeServiceStub),
    "profiles": (profile_service_pb2, profile_service_pb2_grpc.ProfileServiceStub),
    "reflector": (reflector_service_pb2, reflector_service_pb2_grpc.ReflectorServiceStub),
    "sessions": (session_service_pb2, session_service_pb2_grpc.SessionServiceStub),
    "skills": (skill_service_pb2, skill_service_pb2_grpc.SkillServiceStub),
    "telemetry": (telemetry_service_pb2, telemetry_service_pb2_grpc.TelemetryServiceStub),
}


class GrpcOwners:
    def __init__(self, channel_of: Callable[[str], grpc.aio.Channel], timeout: float):
        self._channel_of = channel_of
        self._timeout = timeout

    def _stub(self, owner: str) -> tuple[Any, Any]:
        module, stub = OWNER_STUBS[owner]
        return module, stub(self._channel_of(owner))

    async def erase(self, owner: str, target: Target) -> Report:
        module, stub = self._stub(owner)
        resp = await stub.EraseRows(module.EraseRowsRequest(target=target_to_proto(target)), timeout=self._timeout)
        return report_from_proto(resp.report)

    async def find(self, owner: str, target: Target) -> Report:
        module, stub = self._stub(owner)
        resp = await stub.FindRows(module.FindRowsRequest(target=target_to_proto(target)), timeout=self._timeout)
        return report_from_proto(resp.report)
