"""The gRPC server every service runs on: errors as rich statuses, health, reflection, tracing.

``create_server(registrations, address)`` returns ``(server, port, health)`` without serving
forever, so tests bind port 0 and call real stubs; ``serve`` wraps it with signal handling.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status
from opentelemetry import trace

from libs.common import telemetry
from libs.common.config import ServerConfig
from libs.common.contract import MAX_REPORTED, check_request
from libs.common.errors import AgentLearnError, FieldViolation, Unavailable

__all__ = ["ErrorInterceptor", "LoadShedder", "Registration", "create_server", "status_of"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    """One servicer to mount: its full service name (for health and reflection) and its adder."""

    service_name: str
    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any


def status_of(err: AgentLearnError) -> grpc.Status:
    """The ``google.rpc.Status`` of an error: ErrorInfo always, BadRequest when a field is named."""
    details = []
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=err.reason, domain=err.domain, metadata=err.metadata))
    details.append(info)
    if err.violations:
        bad = any_pb2.Any()
        bad.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                    for v in err.violations
                ]
            )
        )
        details.append(bad)
    return rpc_status.to_status(status_pb2.Status(code=err.code.value[0], message=err.message, details=details))


def _internal_status() -> grpc.Status:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason="INTERNAL", domain="agentlearn.dev"))
    return rpc_status.to_status(
        status_pb2.Status(code=code_pb2.INTERNAL, message="internal error; see the server log", details=[info])
    )


_IDENTITY = ("company", "seat", "turn_id", "observer")


def _label_span(request: Any) -> None:
    """Name the tenant, seat and turn on the RPC's span (a turn's trace is searchable by them)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for field in _IDENTITY:
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            span.set_attribute(field, value[:_MAX_ECHO])
    turn = getattr(request, "turn", None)
    if turn is not None and hasattr(turn, "turn_id"):
        for field in ("company", "seat", "turn_id"):
            value = getattr(turn, field, "")
            if value:
                span.set_attribute(field, value[:_MAX_ECHO])


# A store that cannot be reached is the service's trouble, not the caller's: UNAVAILABLE (retryable).
_STORE_DOWN = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    ConnectionError,
)


def _domain(method: str) -> str:
    """``/agentlearn.diary.v1.DiaryService/WriteNote`` → ``diary.agentlearn.dev``."""
    parts = method.strip("/").split(".")
    return f"{parts[1]}.agentlearn.dev" if len(parts) > 2 and parts[0] == "agentlearn" else "agentlearn.dev"


# A refusal rides in the response trailers, which a client caps (8 KiB by default): a message or a
# metadata value that quotes a caller's 5,000-character input would turn the refusal into the
# client's own RESOURCE_EXHAUSTED with no details. Everything quoted back is cut to these UTF-8
# byte budgets, so the whole status (the message percent-encoded, the details base64) stays near
# 5 KiB at worst.
_MAX_MESSAGE = 300
_MAX_META_KEY = 32
_MAX_META_VALUE = 96
_MAX_META_KEYS = 8
_MAX_FIELD = 80
_MAX_DESCRIPTION = 140
_MAX_ECHO = 200


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes (never inside a character)."""
    raw = text.encode("utf-8", "replace")
    return text if len(raw) <= limit else raw[: limit - 3].decode("utf-8", "ignore") + "..."


def _bounded(err: AgentLearnError) -> AgentLearnError:
    """``err`` with everything it quotes cut to sizes that always fit the caller's metadata."""
    err.message = _cut(err.message, _MAX_MESSAGE)
    err.metadata = {
        _cut(k, _MAX_META_KEY): _cut(v, _MAX_META_VALUE) for k, v in list(err.metadata.items())[:_MAX_META_KEYS]
    }
    err.violations = [
        FieldViolation(_cut(v.field, _MAX_FIELD), _cut(v.description, _MAX_DESCRIPTION))
        for v in err.violations[:MAX_REPORTED]
    ]
    return err


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """The one validating step at the edge, and the one place errors become rich statuses.

    Every request is checked against its contract first (``libs.common.contract``: the protos'
    buf.validate rules, every violated field reported at once, NUL characters and out-of-range
    timestamps anywhere); the error root maps onto rich statuses; an unexpected exception is
    INTERNAL and logged, never the caller's mistake.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        method = handler_call_details.method
        domain = _domain(method)

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            _label_span(request)
            try:
                check_request(request, domain=domain)
                return await inner(request, context)
            except _STORE_DOWN as err:
                _log.warning("%s: store unavailable: %s", method, err)
                await context.abort_with_status(
                    status_of(
                        Unavailable("the store is unavailable; retry later", reason="STORE_UNAVAILABLE", domain=domain)
                    )
                )
            except AgentLearnError as err:
                if err.code == grpc.StatusCode.INTERNAL:
                    _log.error("%s failed: %s", method, err)
                await context.abort_with_status(status_of(_bounded(err)))
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception:
                _log.exception("%s raised", method)
                await context.abort_with_status(_internal_status())

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


# Health checks and reflection answer whatever the load: an orchestrator that cannot read health
# would restart a replica for being busy.
_NEVER_SHED = ("/grpc.health.v1.Health/", "/grpc.reflection.")
RETRY_AFTER_SECONDS = 1.0
"""The retry hint (google.rpc.RetryInfo) a refused call carries."""


def _company_of(request: Any) -> str:
    company = getattr(request, "company", None)
    if not isinstance(company, str):
        turn = getattr(request, "turn", None)
        company = getattr(turn, "company", "") if turn is not None else ""
    return company if isinstance(company, str) else ""


def _overloaded(reason: str, message: str, domain: str, limit: int) -> grpc.Status:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata={"limit": str(limit)}))
    retry = any_pb2.Any()
    retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(RETRY_AFTER_SECONDS))))
    return rpc_status.to_status(
        status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message, details=[info, retry])
    )


class LoadShedder(grpc.aio.ServerInterceptor):
    """Refuses a call at once when the server (or the call's company) already runs its limit of
    calls, with RESOURCE_EXHAUSTED, ErrorInfo and a RetryInfo hint — never queued until its
    deadline, so one tenant's burst cannot starve the others and a caller learns to back off.
    Counters, not semaphores: nothing waits here."""

    def __init__(self, max_calls: int, max_calls_per_company: int):
        self.max_calls = max_calls
        self.max_calls_per_company = max_calls_per_company
        self.in_flight = 0
        self.in_flight_by_company: dict[str, int] = defaultdict(int)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.unary_unary is None or method.startswith(_NEVER_SHED):
            return handler
        inner = handler.unary_unary
        domain = _domain(method)

        async def admitted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            company = _company_of(request)
            if self.in_flight >= self.max_calls:
                await context.abort_with_status(
                    _overloaded(
                        "SERVER_OVERLOADED",
                        f"the server is running its limit of {self.max_calls} calls; retry shortly",
                        domain,
                        self.max_calls,
                    )
                )
            if company and self.in_flight_by_company[company] >= self.max_calls_per_company:
                await context.abort_with_status(
                    _overloaded(
                        "COMPANY_OVERLOADED",
                        f"this company is running its limit of {self.max_calls_per_company} calls; retry shortly",
                        domain,
                        self.max_calls_per_company,
                    )
                )
            self.in_flight += 1
            if company:
                self.in_flight_by_company[company] += 1
            try:
                return await inner(request, context)
            finally:
                self.in_flight -= 1
                if company:
                    left = self.in_flight_by_company[company] - 1
                    if left:
                        self.in_flight_by_company[company] = left
                    else:
                        del self.in_flight_by_company[company]

        return grpc.unary_unary_rpc_method_handler(
            admitted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class Health(HealthServicer):
    """The stock async health servicer, plus ``List`` (every service's status), which the stock one
    leaves unimplemented (a caller saw INTERNAL NotImplementedError)."""

    async def List(self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext) -> Any:
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()
            }
        )


async def create_server(
    registrations: Sequence[Registration], address: str, config: ServerConfig | None = None
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Build and start a server on ``address`` (``host:0`` picks a port); returns the bound port.
    ``config`` carries the load-shedding limits (unset: the defaults of ``ServerConfig``)."""
    config = config or ServerConfig()
    server = grpc.aio.server(
        interceptors=[
            telemetry.server_interceptor(),
            LoadShedder(config.max_concurrent_rpcs, config.max_concurrent_rpcs_per_company),
            ErrorInterceptor(),
        ],
        # Connections are recycled every few minutes so clients re-resolve and spread over the
        # replicas an autoscaler added (a long-lived HTTP/2 channel otherwise sticks to one pod).
        options=[("grpc.max_connection_age_ms", 300_000), ("grpc.max_connection_age_grace_ms", 30_000)],
    )
    health = Health()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for reg in registrations:
        reg.add(reg.servicer, server)
    names = [reg.service_name for reg in registrations]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    await server.start()
    for name in names:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, port, health


async def drain(server: grpc.aio.Server, health: HealthServicer, grace: float) -> None:
    """Graceful shutdown: report NOT_SERVING everywhere, then let in-flight calls finish."""
    await health.enter_graceful_shutdown()
    await server.stop(grace)
