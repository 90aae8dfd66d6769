"""The gRPC server every service runs on: errors as rich statuses, health, reflection, tracing.

``create_server(registrations, address)`` returns ``(server, port, health)`` without serving
forever, so tests bind port 0 and call real stubs; ``serve`` wraps it with signal handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeAlias, cast

import asyncpg
import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode as SpanStatusCode

from libs.common import auth as _auth
from libs.common import telemetry
from libs.common.auth import Authenticator, authorize, current_principal, use_principal
from libs.common.config import ServerConfig
from libs.common.contract import MAX_REPORTED, check_request
from libs.common.errors import AgentLearnError, FieldViolation, Unavailable
from libs.common.metrics import RPC_DURATION
from libs.common.rpctypes import ServicerContext
from libs.common.status_details import passthrough

__all__ = [
    "AuthInterceptor",
    "BindError",
    "BoundServer",
    "CallTracker",
    "ErrorInterceptor",
    "Health",
    "Listener",
    "LoadShedder",
    "LocalServer",
    "Registration",
    "bind_server",
    "create_server",
    "failure_status",
    "local_server",
    "rpc_error",
    "start_server",
    "status_of",
]

_log = logging.getLogger(__name__)

MethodHandler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # a string: not subscriptable at runtime
Continuation: TypeAlias = Callable[[grpc.HandlerCallDetails], Awaitable["MethodHandler | None"]]
AioUnary: TypeAlias = Callable[[Any, ServicerContext], Awaitable[Any]]
AioUnaryStream: TypeAlias = Callable[[Any, ServicerContext], AsyncIterator[Any]]


def _unary_like(handler: MethodHandler, behaviour: Callable[..., Any]) -> MethodHandler:
    """A unary handler doing ``behaviour`` with ``handler``'s (de)serialisers: what every
    interceptor here returns after wrapping the method."""
    return grpc.unary_unary_rpc_method_handler(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _stream_like(handler: MethodHandler, behaviour: Callable[..., Any]) -> MethodHandler:
    """The server-streaming counterpart of :func:`_unary_like`."""
    return grpc.unary_stream_rpc_method_handler(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def aio_unary(handler: MethodHandler) -> AioUnary | None:
    """A handler's unary behaviour as a grpc.aio server holds it: a coroutine function taking the
    aio context. grpc-stubs types ``unary_unary`` as the sync server's (a plain function); every
    server here is asyncio, so this one cast says so once."""
    return cast("AioUnary | None", handler.unary_unary)


def aio_unary_stream(handler: MethodHandler) -> AioUnaryStream | None:
    """A handler's server-streaming behaviour on a grpc.aio server: an async generator function."""
    return cast("AioUnaryStream | None", handler.unary_stream)


@dataclass(frozen=True)
class Registration:
    """One servicer to mount: its full service name (for health and reflection) and its adder."""

    service_name: str
    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any

    @classmethod
    def of(cls, servicer: Any) -> Registration:
        """``servicer`` mounted as the service its generated base class serves: the name and the
        adder are that base's (``FooServicer`` in ``foo_pb2_grpc``: ``add_FooServicer_to_server``,
        and ``Foo`` in ``foo_pb2``), not restated beside each servicer."""
        for base in type(servicer).__mro__:
            if base.__module__.endswith("_pb2_grpc") and base.__name__.endswith("Servicer"):
                stubs = sys.modules[base.__module__]
                messages = sys.modules[base.__module__.removesuffix("_grpc")]
                service = messages.DESCRIPTOR.services_by_name[base.__name__.removesuffix("Servicer")]
                return cls(service.full_name, getattr(stubs, f"add_{base.__name__}_to_server"), servicer)
        raise TypeError(f"{type(servicer).__name__} derives from no generated servicer")


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


_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""The codes a server span marks as an error (OpenTelemetry's gRPC semantic conventions): the
server's faults. A refusal of the caller's request (INVALID_ARGUMENT, NOT_FOUND, ...) is no error
of the server's: its span keeps status UNSET, with the code in ``rpc.grpc.status_code``."""


def _mark_span(code: grpc.StatusCode, span: trace.Span | None = None) -> None:
    """The call's status code on its span (``span``, else the current one, the server span): the
    number in ``rpc.grpc.status_code``, and status ERROR for a server fault (:data:`_SERVER_FAULTS`)."""
    span = span if span is not None else trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_FAULTS:
        span.set_status(SpanStatus(SpanStatusCode.ERROR, code.name))


async def _abort(context: ServicerContext, status: grpc.Status) -> NoReturn:
    """``context.abort_with_status``, with the code on the server span first: OpenTelemetry's server
    interceptor sees ``abort`` and ``set_code``, not ``abort_with_status``, so the span would say
    OK (status code 0, UNSET) for every refusal and every INTERNAL our interceptors answer."""
    _mark_span(status.code)
    await context.abort_with_status(status)


_IDENTITY = ("company", "seat", "turn_id", "observer")


def _label_span(request: Any, span: trace.Span | None = None) -> None:
    """Name the tenant, seat and turn on the RPC's span (``agentlearn.company``, ``agentlearn.seat``,
    ``agentlearn.turn_id``, ``agentlearn.observer``): a turn's trace is searchable by them. ``span``:
    the current one, when the caller holds it already."""
    if span is None:
        span = trace.get_current_span()
    if not span.is_recording():
        return
    for name in _IDENTITY:
        value = getattr(request, name, None)
        if isinstance(value, str) and value:
            span.set_attribute(f"agentlearn.{name}", value)
    turn = getattr(request, "turn", None)
    if turn is not None and hasattr(turn, "turn_id"):
        for name in ("company", "seat", "turn_id"):
            value = getattr(turn, name, "")
            if value:
                span.set_attribute(f"agentlearn.{name}", value)


# A store that cannot be reached is the service's trouble, not the caller's: UNAVAILABLE (retryable).
_STORE_DOWN = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.OperatorInterventionError,  # admin or crash shutdown mid-statement: it comes back
    # A connection left mid-operation by a server that went away under it (a fast shutdown, a
    # crash): asyncpg reports its protocol state, the pool drops the connection, and a retry runs on
    # a fresh one. Seen only with the server going down (tests/test_faults_postgres_restart.py).
    asyncpg.exceptions.InternalClientError,
    ConnectionError,
    FileNotFoundError,  # the embedded server's Unix socket is gone while it restarts
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
# Values bounded by construction, not quoting a caller, read whole: ``tools`` lists the role's
# builtins on a TOOL_NOT_FOUND / TOOL_NOT_OFFERED (at most the eight names, ~125 bytes). Cut at 96
# bytes it dropped its last names and ended in a name that is no tool ("u...").
_META_VALUE_BUDGET = {"tools": 256}
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
        _cut(k, _MAX_META_KEY): _cut(v, _META_VALUE_BUDGET.get(k, _MAX_META_VALUE))
        for k, v in list(err.metadata.items())[:_MAX_META_KEYS]
    }
    err.violations = [
        FieldViolation(_cut(v.field, _MAX_FIELD), _cut(v.description, _MAX_DESCRIPTION))
        for v in err.violations[:MAX_REPORTED]
    ]
    return err


def failure_status(err: Exception, method: str, domain: str) -> grpc.Status:
    """The status a handler's exception answers with: a store that cannot be reached is
    UNAVAILABLE (retryable), our error root its own rich status (cut to size), another service's
    refusal that escaped the handler that service's own status (its code, ErrorInfo and BadRequest:
    ``status_details.passthrough``), anything else INTERNAL and logged with its traceback (call it
    inside the ``except`` block)."""
    if isinstance(err, grpc.aio.AioRpcError):
        _log.warning("%s: a downstream call failed: %s %s", method, err.code().name, err.details())
        err = passthrough(err, domain=domain)
    if isinstance(err, _STORE_DOWN):
        _log.warning("%s: store unavailable: %s", method, err)
        return status_of(
            Unavailable("the store is unavailable; retry later", reason="STORE_UNAVAILABLE", domain=domain)
        )
    if isinstance(err, AgentLearnError):
        if err.code == grpc.StatusCode.INTERNAL:
            _log.error("%s failed: %s", method, err)
        return status_of(_bounded(err))
    _log.exception("%s raised", method)
    return _internal_status()


async def stream_of(inner: AioUnaryStream, request: Any, context: ServicerContext) -> AsyncIterator[Any]:
    """The messages of a server-streaming handler, whichever way it streams: an async generator
    yields them; a coroutine handler writes them itself (``context.write``) and returns None — the
    stock health servicer's Watch does, and every wrapper that iterated it turned Watch into
    UNKNOWN ("'async for' requires an object with __aiter__")."""
    result: Any = inner(request, context)
    if inspect.isawaitable(result):
        await result
        return
    async for item in result:
        yield item


class _WrappingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps each method's behaviour (the methods it ``passes`` answer as they
    are): the one place a handler is looked up, told unary from server-streaming, and rebuilt with
    its (de)serialisers. A subclass says what a unary call does, and a streaming one if it wraps
    those too."""

    passes: tuple[str, ...] = ()
    """Method name prefixes left as they are."""

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(self.passes):
            return handler
        inner = aio_unary(handler)
        if inner is not None:
            return _unary_like(handler, self.wrap_unary(method, inner))
        inner_stream = aio_unary_stream(handler)
        stream = None if inner_stream is None else self.wrap_stream(method, inner_stream)
        # Client-streaming RPCs do not exist here: left as they are, their identity never guessed.
        return handler if stream is None else _stream_like(handler, stream)

    def wrap_unary(self, method: str, inner: AioUnary) -> AioUnary:
        raise NotImplementedError

    def wrap_stream(self, method: str, inner: AioUnaryStream) -> AioUnaryStream | None:
        """A server-streaming method's wrapped behaviour; None (the default) leaves it as it is."""
        return None


class ErrorInterceptor(_WrappingInterceptor):
    """The one validating step at the edge, and the one place errors become rich statuses.

    Every request is checked against its contract first (``libs.common.contract``: the protos'
    buf.validate rules, every violated field reported at once, NUL characters and out-of-range
    timestamps anywhere); the error root maps onto rich statuses; an unexpected exception is
    INTERNAL and logged, never the caller's mistake. A server-streaming call (ExportSeat) is held
    to the same: its request checked before its handler runs (so before any message or any
    downstream call), and whatever its handler raises mid-stream mapped by ``failure_status`` as a
    unary call's would be (the messages already sent stay sent; the status ends the stream).
    """

    def wrap_unary(self, method: str, inner: AioUnary) -> AioUnary:
        domain = _domain(method)

        async def guarded(request: Any, context: ServicerContext) -> Any:
            _label_span(request)
            try:
                check_request(request, domain=domain)
                return await inner(request, context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as err:
                await _abort(context, failure_status(err, method, domain))

        return guarded

    def wrap_stream(self, method: str, inner: AioUnaryStream) -> AioUnaryStream:
        domain = _domain(method)

        async def guarded(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
            _label_span(request)
            try:
                check_request(request, domain=domain)
                async for item in stream_of(inner, request, context):
                    yield item
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as err:
                await _abort(context, failure_status(err, method, domain))

        return guarded


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


class LoadShedder(_WrappingInterceptor):
    """Refuses a call at once when the server (or the call's company) already runs its limit of
    calls, with RESOURCE_EXHAUSTED, ErrorInfo and a RetryInfo hint — never queued until its
    deadline, so one tenant's burst cannot starve the others and a caller learns to back off.
    Counters, not semaphores: nothing waits here."""

    def __init__(self, max_calls: int, max_calls_per_company: int):
        self.max_calls = max_calls
        self.max_calls_per_company = max_calls_per_company
        self.in_flight = 0
        self.in_flight_by_company: dict[str, int] = defaultdict(int)

    def admit(self, company: str, domain: str) -> grpc.Status | None:
        """Count a call in, or the refusal to send it (nothing counted then)."""
        if self.in_flight >= self.max_calls:
            return _overloaded(
                "SERVER_OVERLOADED",
                f"the server is running its limit of {self.max_calls} calls; retry shortly",
                domain,
                self.max_calls,
            )
        if company and self.in_flight_by_company[company] >= self.max_calls_per_company:
            return _overloaded(
                "COMPANY_OVERLOADED",
                f"this company is running its limit of {self.max_calls_per_company} calls; retry shortly",
                domain,
                self.max_calls_per_company,
            )
        self.in_flight += 1
        if company:
            self.in_flight_by_company[company] += 1
        return None

    def release(self, company: str) -> None:
        self.in_flight -= 1
        if company:
            left = self.in_flight_by_company[company] - 1
            if left:
                self.in_flight_by_company[company] = left
            else:
                del self.in_flight_by_company[company]

    passes = _NEVER_SHED

    async def _count_in(self, domain: str, request: Any, context: ServicerContext) -> str | None:
        """Count a call in and say under which company (release it with :meth:`release`), or abort
        it with the refusal. ``None``: not counted — a call one service makes for its own caller,
        whose call was admitted (or refused) already; refusing its inner reads would only degrade
        what it builds. Plain calls rather than a context manager: this runs on every RPC."""
        if current_principal().kind == "service":
            return None
        company = _company_of(request)
        refusal = self.admit(company, domain)
        if refusal is not None:
            await _abort(context, refusal)
        return company

    def wrap_unary(self, method: str, inner: AioUnary) -> AioUnary:
        domain = _domain(method)

        async def admitted(request: Any, context: ServicerContext) -> Any:
            company = await self._count_in(domain, request, context)
            try:
                return await inner(request, context)
            finally:
                if company is not None:
                    self.release(company)

        return admitted

    def wrap_stream(self, method: str, inner: AioUnaryStream) -> AioUnaryStream:
        """A stream (ExportSeat: a whole seat read out) counts as a call for as long as it streams."""
        domain = _domain(method)

        async def admitted(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
            company = await self._count_in(domain, request, context)
            try:
                async for item in stream_of(inner, request, context):
                    yield item
            finally:
                if company is not None:
                    self.release(company)

        return admitted


class Health(HealthServicer):
    """The stock async health servicer, plus ``List`` (every service's status), which the stock one
    leaves unimplemented (a caller saw INTERNAL NotImplementedError)."""

    async def List(self, request: Any, context: ServicerContext) -> Any:
        # types-grpcio-health-checking predates List: its messages and the servicer's status map
        # exist at runtime (grpcio-health-checking 1.85) but not in the stubs.
        statuses: dict[str, Any] = self._server_status  # type: ignore[attr-defined]  # stock servicer's map, untyped
        response = health_pb2.HealthListResponse  # type: ignore[attr-defined]  # in the runtime module, not the stub
        return response(statuses={name: health_pb2.HealthCheckResponse(status=s) for name, s in statuses.items()})


_UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Health (probes) and reflection (schemas only) answer without a credential."""


class AuthInterceptor(_WrappingInterceptor):
    """Authenticates every call and authorizes it before its handler runs (see ``libs.common.auth``):
    no or a bad credential is UNAUTHENTICATED; a scope the RPC's proto declares and the credential
    lacks, or a company / seat / user the request names and the credential is not bound to, is
    PERMISSION_DENIED — decided before anything is read, so it never says whether a row exists."""

    def __init__(self, authenticator: Authenticator):
        self.authenticator = authenticator

    passes = _UNAUTHENTICATED_PREFIXES

    async def _admit(self, method: str, request: Any, context: ServicerContext) -> None:
        authenticator = self.authenticator
        metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        peer = context.auth_context() or {}
        names = [n.decode() for n in peer.get("x509_common_name", [])] if authenticator.trusts_peers else []
        try:
            principal = await authenticator.authenticate(metadata, names)
            authorize(principal, method, request)
        except AgentLearnError as err:
            err.domain = _domain(method) if err.domain == "agentlearn.dev" else err.domain
            await _abort(context, status_of(err))  # raises: the handler never runs
        use_principal(principal)
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("agentlearn.principal", principal.kind)
            if principal.token_id:
                span.set_attribute("agentlearn.token_id", principal.token_id)

    def wrap_unary(self, method: str, inner: AioUnary) -> AioUnary:
        async def unary(request: Any, context: ServicerContext) -> Any:
            await self._admit(method, request, context)
            return await inner(request, context)

        return unary

    def wrap_stream(self, method: str, inner: AioUnaryStream) -> AioUnaryStream:
        async def stream(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
            await self._admit(method, request, context)
            async for item in stream_of(inner, request, context):
                yield item

        return stream


class BindError(OSError):
    """A port that cannot be bound (taken, or an invalid address)."""


@dataclass(frozen=True)
class Listener:
    """One port a server binds: plaintext, TLS, or mutual TLS (a client certificate signed by
    ``client_ca`` required: the internal listener calls between services use on Kubernetes)."""

    address: str
    cert: bytes | None = None
    key: bytes | None = None
    client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.cert is None or self.key is None:
            if self.client_ca is not None:
                raise ValueError(f"{self.address}: mutual TLS needs a certificate and a key")
            return None
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def _rpc_labels(method: str) -> dict[str, str]:
    service, _, name = method.strip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _record_rpc(labels: dict[str, str], context: ServicerContext, started: float) -> None:
    # aio contexts report a raw status number (the stubs say StatusCode, the sync server's type)
    code: grpc.StatusCode | int | None = context.code()
    if isinstance(code, int):
        code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    status = code.name if code is not None else "OK"
    RPC_DURATION.record((time.perf_counter() - started) * 1000, {**labels, "rpc.grpc.status_code": status})


class CallTracker(grpc.aio.ServerInterceptor):
    """Counts the calls a server is running, so a drain can tell when it is idle, and records each
    call's duration and status code (``rpc.server.duration``).

    gRPC's own graceful stop cancels every call the server has received but not yet handed to a
    handler, and a busy event loop hands them over slowly: stopping at once on SIGTERM cancelled
    most of a burst in flight. So a drain keeps serving until nothing has run for a moment."""

    def __init__(self) -> None:
        self.active = 0
        self.last_activity = time.monotonic()
        self._idle = asyncio.Event()
        self._idle.set()

    def _enter(self) -> None:
        self.active += 1
        self.last_activity = time.monotonic()
        self._idle.clear()

    def _exit(self) -> None:
        self.active -= 1
        self.last_activity = time.monotonic()
        if self.active == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler | None:
        self._enter()
        try:
            handler = await continuation(handler_call_details)
        except BaseException:
            self._exit()
            raise
        inner = None if handler is None else aio_unary(handler)
        inner_stream = None if handler is None else aio_unary_stream(handler)
        if handler is None or (inner is None and inner_stream is None):
            self._exit()
            return handler
        labels = _rpc_labels(handler_call_details.method)
        if inner is not None:

            async def unary(request: Any, context: ServicerContext) -> Any:
                started = time.perf_counter()
                try:
                    return await inner(request, context)
                finally:
                    self._exit()
                    _record_rpc(labels, context, started)

            return _unary_like(handler, unary)
        assert inner_stream is not None  # one of the two, checked above

        async def stream(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for item in stream_of(inner_stream, request, context):
                    yield item
            finally:
                self._exit()
                _record_rpc(labels, context, started)

        return _stream_like(handler, stream)


@dataclass
class BoundServer:
    """A server whose ports are bound but which serves nothing yet (``start_server``)."""

    server: grpc.aio.Server
    ports: list[int]
    health: HealthServicer
    calls: CallTracker
    authenticator: Authenticator | None = None
    """Who its callers are (an in-process call is authenticated by the same one)."""
    shedder: LoadShedder | None = None
    """Its load-shedding counters (shared with the in-process calls)."""

    @property
    def port(self) -> int:
        return self.ports[0]


def bind_server(
    listeners: Sequence[Listener] | str,
    *,
    authenticator: Authenticator | None = None,
    config: ServerConfig | None = None,
) -> BoundServer:
    """Build a server and bind its ports now, so a port already served fails in a second, before
    any store is opened. ``SO_REUSEPORT`` is off: a second server on a taken port must not answer
    half the calls."""
    if isinstance(listeners, str):
        listeners = [Listener(listeners)]
    authenticator = authenticator or Authenticator(None, None, mode="local")
    config = config or ServerConfig()
    calls = CallTracker()
    shedder = LoadShedder(config.max_concurrent_rpcs, config.max_concurrent_rpcs_per_company)
    server = grpc.aio.server(
        # Outermost first: count the call, span it, authenticate it (before anything else is told
        # about it), shed it past the limits, then check its contract and map errors.
        interceptors=[
            calls,
            telemetry.server_interceptor(),
            AuthInterceptor(authenticator),
            shedder,
            ErrorInterceptor(),
        ],
        options=[
            ("grpc.so_reuseport", 0),
            # Connections are recycled every few minutes so clients re-resolve and spread over the
            # replicas an autoscaler added (a long-lived HTTP/2 channel otherwise sticks to one pod).
            ("grpc.max_connection_age_ms", 300_000),
            ("grpc.max_connection_age_grace_ms", 30_000),
        ],
    )
    ports = []
    for listener in listeners:
        creds = listener.credentials()
        try:
            port = (
                server.add_secure_port(listener.address, creds)
                if creds is not None
                else server.add_insecure_port(listener.address)
            )
        except RuntimeError as err:
            raise BindError(f"cannot bind {listener.address}: the port is taken or the address is invalid") from err
        if port == 0:
            raise BindError(f"cannot bind {listener.address}: the port is taken or the address is invalid")
        ports.append(port)
    health = Health()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return BoundServer(server, ports, health, calls, authenticator, shedder)


async def start_server(bound: BoundServer, registrations: Sequence[Registration]) -> None:
    """Mount the servicers (with reflection) and start serving; every service reports SERVING."""
    for reg in registrations:
        reg.add(reg.servicer, bound.server)
    names = [reg.service_name for reg in registrations]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], bound.server
    )
    await bound.server.start()
    _register_local(bound, registrations)
    for name in names:
        await bound.health.set(name, health_pb2.HealthCheckResponse.SERVING)
    await bound.health.set("", health_pb2.HealthCheckResponse.SERVING)


async def create_server(
    registrations: Sequence[Registration],
    address: str,
    config: ServerConfig | None = None,
    *,
    authenticator: Authenticator | None = None,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Build and start a server on ``address`` (``host:0`` picks a port); returns the bound port.
    ``config`` carries the load-shedding limits (unset: the defaults of ``ServerConfig``); without
    an authenticator every call runs in local mode."""
    bound = bind_server(address, authenticator=authenticator, config=config)
    await start_server(bound, registrations)
    return bound.server, bound.port, bound.health


async def drain(bound: BoundServer, grace: float, *, settle: float = 0.5) -> None:
    """Graceful shutdown: report NOT_SERVING everywhere, keep serving what is in flight (and what
    the transport already received) until nothing has run for ``settle`` seconds or ``grace`` is
    spent, then stop; a call still running at the end of the grace is cancelled."""
    deadline = time.monotonic() + grace
    await bound.health.enter_graceful_shutdown()
    calls = bound.calls
    while (left := deadline - time.monotonic()) > 0:
        if not await calls.wait_idle(left):
            break
        quiet = time.monotonic() - calls.last_activity
        if quiet >= settle:
            break
        await asyncio.sleep(min(settle - quiet, max(0.0, deadline - time.monotonic())))
    await bound.server.stop(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------------------------
# In-process calls (the all-in-one): a service calling another service this process serves awaits
# the servicer directly (``libs.common.channels``), keeping what the hop guarantees.
# --------------------------------------------------------------------------------------------

_tracer = trace.get_tracer("agentlearn.rpc")


class _HandlerCollector:
    """Stands in for a grpc server so a generated ``add_*Servicer_to_server`` hands over its
    method handlers (by name; a generic handler is asked per method)."""

    def __init__(self) -> None:
        self.handlers: dict[str, MethodHandler] = {}
        self.generic: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, MethodHandler]) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


@dataclass(frozen=True)
class _CallDetails:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _Status:
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()


class _LocalAbort(Exception):
    """``context.abort*`` of a call served in-process: ends it with ``status``."""

    def __init__(self, status: Any):
        super().__init__(status.details)
        self.status = status


class LocalContext:
    """The servicer context of a call served in-process: its metadata, its deadline, and the
    aborts that end it with a status (what our handlers and interceptors read of a context)."""

    def __init__(self, metadata: Sequence[tuple[str, str | bytes]], deadline: float | None):
        self._metadata = tuple(metadata)
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer(self) -> str:
        return "inproc"

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _LocalAbort(_Status(code, details, tuple(trailing_metadata or ())))

    async def abort_with_status(self, status: Any) -> None:
        raise _LocalAbort(status)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailing

    async def send_initial_metadata(self, metadata: Any) -> None:
        return None

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False


def rpc_error(status: Any) -> grpc.aio.AioRpcError:
    """The exception a wire call ending with ``status`` raises in its caller: code, details and the
    trailing ``grpc-status-details-bin`` (ErrorInfo, BadRequest, RetryInfo), so
    ``rpc_status.from_call`` reads it as it reads a wire call's."""
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*(status.trailing_metadata or ())),
        status.details,
        "in-process call",
    )


_INPROC = "inproc"
_STATUS_NAMES = tuple(code.name for code in grpc.StatusCode)  # OK among them


@dataclass(frozen=True, slots=True)
class _MethodPlan:
    """What an in-process call of one method needs that no call changes, worked out at its first
    call: its behaviour, its ErrorInfo domain, its span's name and attributes, and the
    ``rpc.server.duration`` attributes of each status code (the dicts are shared by every call of
    the method, so nothing mutates them: the SDK may keep a reference to a metric's)."""

    inner: AioUnary
    domain: str
    labels: dict[str, str]
    span_name: str
    span_attributes: dict[str, str]
    metric_attributes: dict[str, dict[str, str]]

    @classmethod
    def of(cls, method: str, inner: AioUnary) -> _MethodPlan:
        labels = _rpc_labels(method)
        return cls(
            inner,
            _domain(method),
            labels,
            method.lstrip("/"),
            {**labels, "network.transport": _INPROC},
            {code: _metric_attributes(labels, code) for code in _STATUS_NAMES},
        )

    def metric_attributes_of(self, code: str) -> dict[str, str]:
        """``rpc.server.duration``'s attributes for a call ending with ``code`` (a StatusCode name)."""
        attributes = self.metric_attributes.get(code)
        return attributes if attributes is not None else _metric_attributes(self.labels, code)


def _metric_attributes(labels: dict[str, str], code: str) -> dict[str, str]:
    return {**labels, "rpc.grpc.status_code": code, "network.transport": _INPROC}


@dataclass
class LocalServer:
    """The servicers one started server of this process mounts, served in-process: a call is
    authenticated by the server's authenticator (so the callee sees the caller's service principal),
    authorized by the RPC's scope, shed by the server's counters when its principal is not a
    service, checked against its contract, run under one internal span, and its failure turned into
    the status the wire would carry — every step the server's interceptors take, without
    serialisation, HTTP/2 or a client/server span pair. ``rpc.server.duration`` records it with
    ``network.transport=inproc``; the server's CallTracker (wire calls) never sees it.

    What does not change from call to call (the handler, span name and attributes, metric
    attributes) is worked out once per method (:class:`_MethodPlan`): an in-process call is the
    all-in-one's inner loop (a turn start makes several, each paying this fixed cost)."""

    handlers: dict[str, MethodHandler]
    generic: list[Any]
    authenticator: Authenticator
    shedder: LoadShedder | None
    _plans: dict[str, _MethodPlan] = field(default_factory=dict, init=False, repr=False)

    def handler(self, method: str) -> MethodHandler | None:
        handler = self.handlers.get(method)
        if handler is None:
            for generic in self.generic:
                handler = generic.service(_CallDetails(method))
                if handler is not None:
                    self.handlers[method] = handler
                    break
        return handler

    def plan(self, method: str) -> _MethodPlan | None:
        """The method's plan (None: no unary method of that name is served here)."""
        plan = self._plans.get(method)
        if plan is None:
            handler = self.handler(method)
            inner = None if handler is None else aio_unary(handler)
            if inner is None:
                return None  # not kept: a generic handler is asked again, as before plans
            plan = self._plans[method] = _MethodPlan.of(method, inner)
        return plan

    async def call(
        self, method: str, request: Any, metadata: Sequence[tuple[str, str | bytes]], deadline: float | None
    ) -> Any:
        """The response, or the AioRpcError a wire call would raise."""
        plan = self.plan(method)
        if plan is None:
            raise rpc_error(_Status(grpc.StatusCode.UNIMPLEMENTED, "Method not found!"))
        domain = plan.domain
        started = time.perf_counter()
        status: Any = None
        shed_company: str | None = None
        token = None
        # start_span + use_span is what start_as_current_span does (SDK and no-op tracer alike),
        # without its two generator context managers.
        span = _tracer.start_span(plan.span_name, kind=trace.SpanKind.INTERNAL, attributes=plan.span_attributes)
        with trace.use_span(span, end_on_exit=True):
            try:
                try:
                    principal = await self.authenticator.authenticate(
                        {k.lower(): v for k, v in metadata if isinstance(v, str)}, ()
                    )
                    authorize(principal, method, request)
                except AgentLearnError as err:
                    err.domain = domain if err.domain == "agentlearn.dev" else err.domain
                    raise _LocalAbort(status_of(err)) from None
                token = use_principal(principal)
                recording = span.is_recording()
                if recording:
                    span.set_attribute("agentlearn.principal", principal.kind)
                if principal.kind != "service" and self.shedder is not None:
                    company = _company_of(request)
                    refusal = self.shedder.admit(company, domain)
                    if refusal is not None:
                        raise _LocalAbort(refusal)
                    shed_company = company
                if recording:
                    _label_span(request, span)
                check_request(request, domain=domain)
                # LocalContext is the part of a servicer context our handlers and interceptors use.
                return await plan.inner(request, cast(ServicerContext, LocalContext(metadata, deadline)))
            except _LocalAbort as abort:
                status = abort.status
            except asyncio.CancelledError:
                status = _Status(grpc.StatusCode.CANCELLED, "Cancelled")
                raise
            except Exception as err:
                status = failure_status(err, method, domain)
            finally:
                if shed_company is not None and self.shedder is not None:
                    self.shedder.release(shed_company)
                if token is not None:
                    _auth.reset_principal(token)
                code = status.code.name if status is not None else "OK"
                _mark_span(status.code if status is not None else grpc.StatusCode.OK, span)
                RPC_DURATION.record((time.perf_counter() - started) * 1000, plan.metric_attributes_of(code))
        raise rpc_error(status)


_LOCAL_SERVERS: dict[int, LocalServer] = {}
_WATCHERS: set[asyncio.Task[None]] = set()


def _register_local(bound: BoundServer, registrations: Sequence[Registration]) -> None:
    """Make the started server's services callable in-process on its ports until it stops."""
    collector = _HandlerCollector()
    for reg in registrations:
        # The collector is the part of a server an add_*Servicer_to_server calls.
        reg.add(reg.servicer, cast(grpc.aio.Server, collector))
    local = LocalServer(
        collector.handlers,
        collector.generic,
        bound.authenticator or Authenticator(None, None, mode="local"),
        bound.shedder,
    )
    for port in bound.ports:
        _LOCAL_SERVERS[port] = local

    async def forget() -> None:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await bound.server.wait_for_termination()
        for port in bound.ports:
            if _LOCAL_SERVERS.get(port) is local:
                del _LOCAL_SERVERS[port]

    watcher = asyncio.create_task(forget(), name="local-server-watch")
    _WATCHERS.add(watcher)
    watcher.add_done_callback(_WATCHERS.discard)


def local_port(address: str) -> int | None:
    """``address``'s port when it is one plain host:port (a resolver target such as
    ``ipv4:a:1,b:2`` is the wire's: None)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "," in address or (":" in host and not host.startswith("[")):
        return None
    return int(port)


def local_server(address: str) -> LocalServer | None:
    """The server of this process bound on ``address``'s port and still serving, if any."""
    return local_server_on(local_port(address))


def local_server_on(port: int | None) -> LocalServer | None:
    """The server of this process bound on ``port`` (:func:`local_port`) and still serving, if any."""
    return None if port is None else _LOCAL_SERVERS.get(port)
