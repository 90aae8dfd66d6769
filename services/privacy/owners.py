"""The owners an erasure asks, over their ``EraseRows`` / ``FindRows`` RPCs (each service erases
its own rows). A port, so the coordinator does not care where an owner runs."""

from __future__ import annotations

from typing import Any

from agentlearn.diary.v1 import diary_service_pb2
from agentlearn.episodes.v1 import episode_service_pb2
from agentlearn.knowledge.v1 import knowledge_service_pb2
from agentlearn.prefetch.v1 import prefetch_service_pb2
from agentlearn.profiles.v1 import profile_service_pb2
from agentlearn.reflector.v1 import reflector_service_pb2
from agentlearn.sessions.v1 import session_service_pb2
from agentlearn.skills.v1 import skill_service_pb2
from agentlearn.telemetry.v1 import telemetry_service_pb2
from libs.common.clients import Clients
from libs.common.erasure import Report, Target, report_from_proto, target_to_proto

__all__ = ["GrpcOwners"]


class GrpcOwners:
    def __init__(self, clients: Clients):
        self._clients = clients

    def _stub(self, owner: str) -> tuple[Any, Any]:
        """The owner's messages module and stub (spelled out: the manifests' call table is read
        from these names, tests/test_k8s_manifests.py)."""
        if owner == "diary":
            return diary_service_pb2, self._clients.diary
        if owner == "episodes":
            return episode_service_pb2, self._clients.episodes
        if owner == "knowledge":
            return knowledge_service_pb2, self._clients.knowledge
        if owner == "prefetch":
            return prefetch_service_pb2, self._clients.prefetch
        if owner == "profiles":
            return profile_service_pb2, self._clients.profiles
        if owner == "reflector":
            return reflector_service_pb2, self._clients.reflector
        if owner == "sessions":
            return session_service_pb2, self._clients.sessions
        if owner == "skills":
            return skill_service_pb2, self._clients.skills
        if owner == "telemetry":
            return telemetry_service_pb2, self._clients.telemetry
        raise KeyError(owner)

    async def erase(self, owner: str, target: Target) -> Report:
        module, stub = self._stub(owner)
        request = module.EraseRowsRequest(target=target_to_proto(target))
        resp = await stub.EraseRows(request, timeout=self._clients.timeout)
        return report_from_proto(resp.report)

    async def find(self, owner: str, target: Target) -> Report:
        module, stub = self._stub(owner)
        request = module.FindRowsRequest(target=target_to_proto(target))
        resp = await stub.FindRows(request, timeout=self._clients.timeout)
        return report_from_proto(resp.report)
