"""The inspector's one door to the services: their gRPC stubs (``libs.common.clients``, the same
clients the services use on one another, carrying the service identity), each call with the
configured deadline, and a refusal turned into a :class:`ServiceError` a page can render.

The inspector never reads a table. It also never lets a caller reach a service it could not reach
itself: the pages check the signed-in principal (company, seat, scopes) before they call anything
here, because these calls run as the trusted service identity."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
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


class _Service:
    """``gateway.<service>``: a call on that service's stub, named by the attribute (the same name
    as its client in ``Clients``)."""

    def __set_name__(self, owner: type[Gateway], name: str) -> None:
        self.name = name

    def __get__(self, gateway: Gateway, owner: type[Gateway]) -> Callable[[str, Any], Awaitable[Any]]:
        return functools.partial(gateway.call, self.name)


class Gateway:
    """One method per service: ``await gateway.skills("GetSkill", request)``."""

    def __init__(self, clients: Clients):
        self.clients = clients

    async def call(self, service: str, method: str, request: Any) -> Any:
        """``method`` of ``service`` with the configured deadline; a refusal as a ServiceError."""
        try:
            return await getattr(getattr(self.clients, service), method)(request, timeout=self.clients.timeout)
        except grpc.aio.AioRpcError as err:
            raise ServiceError.of(service, err) from None

    diary = _Service()
    episodes = _Service()
    skills = _Service()
    knowledge = _Service()
    profiles = _Service()
    reflector = _Service()
    sessions = _Service()
    telemetry = _Service()
