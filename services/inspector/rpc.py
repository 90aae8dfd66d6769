"""The inspector's one door to the services: their gRPC stubs (``libs.common.clients``, the same
clients the services use on one another, carrying the service identity), each call with the
configured deadline, and a refusal turned into a :class:`ServiceError` a page can render.

The inspector never reads a table. It also never lets a caller reach a service it could not reach
itself: the pages check the signed-in principal (company, seat, scopes) before they call anything
here, because these calls run as the trusted service identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from libs.common.clients import Clients
from libs.common.status_details import status_details

__all__ = ["HTTP_STATUS", "Gateway", "ServiceError"]

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""How a service's refusal reads over HTTP; anything else is the service's fault (502)."""


@dataclass
class ServiceError(Exception):
    """A call a service refused or could not answer: its code, ErrorInfo reason and message, and
    the first field it names."""

    service: str
    code: grpc.StatusCode
    reason: str
    message: str
    field: str = ""

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 502)

    @classmethod
    def of(cls, service: str, err: grpc.aio.AioRpcError) -> ServiceError:
        said = status_details(err)
        reason, field = (said.info.reason if said.info else ""), said.first_field
        code = err.code()
        # The message of a service we reached is its own, meant for callers; one we did not reach
        # has only the transport's words, which say nothing useful to a person.
        message = err.details() if reason else f"the {service} service did not answer ({code.name})"
        return cls(service, code, reason or code.name, message or code.name, field)


class Gateway:
    """One method per service: ``await gateway.skills("GetSkill", request)``."""

    def __init__(self, clients: Clients):
        self.clients = clients

    async def _call(self, service: str, stub: Any, method: str, request: Any) -> Any:
        try:
            return await getattr(stub, method)(request, timeout=self.clients.timeout)
        except grpc.aio.AioRpcError as err:
            raise ServiceError.of(service, err) from None

    async def diary(self, method: str, request: Any) -> Any:
        return await self._call("diary", self.clients.diary, method, request)

    async def episodes(self, method: str, request: Any) -> Any:
        return await self._call("episodes", self.clients.episodes, method, request)

    async def skills(self, method: str, request: Any) -> Any:
        return await self._call("skills", self.clients.skills, method, request)

    async def knowledge(self, method: str, request: Any) -> Any:
        return await self._call("knowledge", self.clients.knowledge, method, request)

    async def profiles(self, method: str, request: Any) -> Any:
        return await self._call("profiles", self.clients.profiles, method, request)

    async def reflector(self, method: str, request: Any) -> Any:
        return await self._call("reflector", self.clients.reflector, method, request)

    async def sessions(self, method: str, request: Any) -> Any:
        return await self._call("sessions", self.clients.sessions, method, request)

    async def telemetry(self, method: str, request: Any) -> Any:
        return await self._call("telemetry", self.clients.telemetry, method, request)
