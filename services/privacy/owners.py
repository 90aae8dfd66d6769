"""The owners an erasure asks, over their ``EraseRows`` / ``FindRows`` RPCs (each service erases
its own rows). A port, so the coordinator does not care where an owner runs."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
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


_OWNERS: dict[str, tuple[ModuleType, Callable[[Clients], Any]]] = {
    # Each owner's messages module and how its stub is reached (``clients.<name>`` spelled out:
    # the manifests' call table is read from these names, tests/test_k8s_manifests.py).
    "diary": (diary_service_pb2, lambda clients: clients.diary),
    "episodes": (episode_service_pb2, lambda clients: clients.episodes),
    "knowledge": (knowledge_service_pb2, lambda clients: clients.knowledge),
    "prefetch": (prefetch_service_pb2, lambda clients: clients.prefetch),
    "profiles": (profile_service_pb2, lambda clients: clients.profiles),
    "reflector": (reflector_service_pb2, lambda clients: clients.reflector),
    "sessions": (session_service_pb2, lambda clients: clients.sessions),
    "skills": (skill_service_pb2, lambda clients: clients.skills),
    "telemetry": (telemetry_service_pb2, lambda clients: clients.telemetry),
}


class GrpcOwners:
    def __init__(self, clients: Clients):
        self._clients = clients

    async def _ask(self, owner: str, rpc: str, target: Target) -> Report:
        """``rpc`` (``EraseRows`` or ``FindRows``: the same request and answer in every owner's
        messages) of ``owner`` about ``target``."""
        module, stub_of = _OWNERS[owner]
        request = getattr(module, f"{rpc}Request")(target=target_to_proto(target))
        resp = await getattr(stub_of(self._clients), rpc)(request, timeout=self._clients.timeout)
        return report_from_proto(resp.report)

    async def erase(self, owner: str, target: Target) -> Report:
        return await self._ask(owner, "EraseRows", target)

    async def find(self, owner: str, target: Target) -> Report:
        return await self._ask(owner, "FindRows", target)
