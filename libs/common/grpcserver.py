"""The gRPC server every service runs on: errors as rich statuses, health, reflection, tracing.

``create_server(registrations, address)`` returns ``(server, port, health)`` without serving
forever, so tests bind port 0 and call real stubs; ``serve`` wraps it with signal handling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status
from opentelemetry import trace

from libs.common import telemetry
from libs.common.errors import AgentLearnError, InvalidArgument, Unavailable

__all__ = ["Registration", "create_server", "status_of"]

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
            span.set_attribute(field, value)
    turn = getattr(request, "turn", None)
    if turn is not None and hasattr(turn, "turn_id"):
        for field in ("company", "seat", "turn_id"):
            value = getattr(turn, field, "")
            if value:
                span.set_attribute(field, value)


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


def _nul_field(msg: Any, prefix: str = "") -> str | None:
    """The path of the first string field (at any depth) that contains U+0000, if any."""
    if not hasattr(msg, "ListFields"):
        return None
    for field, value in msg.ListFields():
        name = f"{prefix}{field.name}"
        repeated = field.is_repeated
        if field.type == field.TYPE_STRING:
            items = list(value) if repeated else [value]
            for i, item in enumerate(items):
                if "\x00" in item:
                    return f"{name}[{i}]" if repeated else name
        elif field.type == field.TYPE_MESSAGE and not (field.message_type.GetOptions().map_entry):
            items = list(value) if repeated else [value]
            for i, item in enumerate(items):
                found = _nul_field(item, f"{name}[{i}]." if repeated else f"{name}.")
                if found:
                    return found
    return None


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps the error root onto rich statuses; an unexpected exception is INTERNAL and logged."""

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

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            _label_span(request)
            try:
                nul = _nul_field(request)
                if nul is not None:
                    # PostgreSQL text cannot hold U+0000: refuse it as the caller's, naming the field.
                    raise InvalidArgument(
                        f"{nul} contains a NUL character (U+0000), which text fields cannot hold",
                        reason="FIELD_INVALID",
                        domain=_domain(method),
                        field=nul,
                    )
                return await inner(request, context)
            except _STORE_DOWN as err:
                _log.warning("%s: store unavailable: %s", method, err)
                await context.abort_with_status(
                    status_of(
                        Unavailable(
                            "the store is unavailable; retry later", reason="STORE_UNAVAILABLE", domain=_domain(method)
                        )
                    )
                )
            except AgentLearnError as err:
                if err.code == grpc.StatusCode.INTERNAL:
                    _log.error("%s failed: %s", method, err)
                await context.abort_with_status(status_of(err))
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


async def create_server(
    registrations: Sequence[Registration], address: str
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Build and start a server on ``address`` (``host:0`` picks a port); returns the bound port."""
    server = grpc.aio.server(
        interceptors=[telemetry.server_interceptor(), ErrorInterceptor()],
        # Connections are recycled every few minutes so clients re-resolve and spread over the
        # replicas an autoscaler added (a long-lived HTTP/2 channel otherwise sticks to one pod).
        options=[("grpc.max_connection_age_ms", 300_000), ("grpc.max_connection_age_grace_ms", 30_000)],
    )
    health = HealthServicer()
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
