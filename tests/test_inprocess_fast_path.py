"""The in-process fast path (``LocalServer``'s per-method plan, the trusted principal's short cut,
the authenticator's one Principal per service) answers every call as the per-call path did: the
same status, ErrorInfo and BadRequest as the wire, the same span (name, kind, attributes) and the
same ``rpc.server.duration`` attributes, for a call that succeeds, one refused by its credential's
scope or company, one shed, one without a credential and one breaking the contract. The expected
spans and metric attributes are written out here; every test but ``test_a_method_has_one_plan``
passes unchanged against the tree before the plan (docs/perf/runs/2026-12-03-w12-rpcpath/NOTES.md).

Real server on loopback, real PostgreSQL token store, the OpenTelemetry SDK with an in-memory
exporter; the metric's attributes are read where the server records them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as prof_grpc
from libs.common import grpcserver, telemetry
from libs.common.auth import LOCAL, Authenticator, Principal, TokenStore, authorize, current_principal
from libs.common.channels import ServiceChannels
from libs.common.config import ServerConfig, ServiceAddresses, TelemetryConfig
from libs.common.grpcserver import Registration, bind_server, local_server, start_server
from tests.support.grpc_errors import error_info

SECRET = "s3cret"
METHOD = "/agentlearn.profiles.v1.ProfileService/GetProfiles"
LABELS = {"rpc.system": "grpc", "rpc.service": "agentlearn.profiles.v1.ProfileService", "rpc.method": "GetProfiles"}
REQUEST = prof_pb.GetProfilesRequest(
    company="acme", observer="ana", subjects=[prof_pb.Subject(handle="bob", platform="slack")]
)


class Profiles(prof_grpc.ProfileServiceServicer):
    """Answers at once, or parks inside until released when ``hold`` is set (to fill the shedder)."""

    def __init__(self) -> None:
        self.hold = False
        self.inside = asyncio.Event()
        self.release = asyncio.Event()
        self.principals: list[Principal] = []

    async def GetProfiles(self, request, context):  # type: ignore[no-untyped-def]
        self.principals.append(current_principal())
        if self.hold:
            self.inside.set()
            await self.release.wait()
        return prof_pb.GetProfilesResponse()


class Recorder:
    """Stands in for ``RPC_DURATION``: what each recording was given."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def record(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        assert amount >= 0
        self.seen.append(dict(attributes or {}))


@dataclass
class Served:
    servicer: Profiles
    tokens: TokenStore
    service: ServiceChannels  # the deployment's own channels: a service principal
    engine: ServiceChannels  # no secret: a caller holding (or not) a bearer token
    address: str
    exporter: InMemorySpanExporter
    durations: Recorder

    def stub(self, channels: ServiceChannels, in_process: bool) -> prof_grpc.ProfileServiceStub:
        channels.in_process = in_process
        return prof_grpc.ProfileServiceStub(channels.channel("profiles"))

    def spans(self) -> list[Any]:
        """The in-process calls' spans since the last look."""
        found = [
            s for s in self.exporter.get_finished_spans() if (s.attributes or {}).get("network.transport") == "inproc"
        ]
        self.exporter.clear()
        return found

    def inproc_metrics(self) -> list[dict[str, str]]:
        found = [a for a in self.durations.seen if a.get("network.transport") == "inproc"]
        self.durations.seen.clear()
        return found


_EXPORTER = InMemorySpanExporter()
_TRACING: list[bool] = []


def _tracing() -> None:
    """The SDK's provider with our exporter (a processor added once: a provider keeps them all)."""
    if not _TRACING:
        telemetry.configure_tracing(TelemetryConfig(), extra_processors=[SimpleSpanProcessor(_EXPORTER)])
        _TRACING.append(True)


@pytest.fixture
async def served(dsn, clock, monkeypatch) -> AsyncIterator[Served]:  # type: ignore[no-untyped-def]
    _tracing()
    durations = Recorder()
    monkeypatch.setattr(grpcserver, "RPC_DURATION", durations)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    tokens = TokenStore(pool, clock)
    auth = Authenticator(tokens, clock, mode="tokens", internal_secret=SECRET)
    bound = bind_server("127.0.0.1:0", authenticator=auth, config=ServerConfig(max_concurrent_rpcs=1))
    servicer = Profiles()
    await start_server(bound, [Registration.of(servicer)])
    address = f"127.0.0.1:{bound.port}"
    service = ServiceChannels(ServiceAddresses(), internal_secret=SECRET, caller="agentlearn-prefetch")
    engine = ServiceChannels(ServiceAddresses())
    for channels in (service, engine):
        channels.serve_locally(["profiles"], address)
    _EXPORTER.clear()
    try:
        yield Served(servicer, tokens, service, engine, address, _EXPORTER, durations)
    finally:
        servicer.release.set()
        await service.close()
        await engine.close()
        await bound.server.stop(None)
        await pool.close()


def _refusal(err: grpc.aio.AioRpcError) -> tuple:
    """Everything a caller can read of a refusal."""
    code, info, bad = error_info(err)
    fields = [(v.field, v.description) for v in bad.field_violations] if bad is not None else []
    return code, err.details(), info.reason, info.domain, dict(info.metadata), fields


async def _refused_both_ways(served: Served, channels: ServiceChannels, request: Any, metadata: Any = ()) -> tuple:
    """The refusal in-process, then over the wire: they must be one refusal."""
    out = []
    for in_process in (True, False):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await served.stub(channels, in_process).GetProfiles(request, timeout=10, metadata=metadata)
        out.append(_refusal(exc.value))
    assert out[0] == out[1]
    return out[0]


def _span(served: Served) -> tuple[str, trace.SpanKind, dict[str, Any], Any]:
    [span] = served.spans()
    return span.name, span.kind, dict(span.attributes), span.status.status_code


def _attributes(code: str, **extra: str) -> dict[str, str | int]:
    """A span's attributes: the status code by its number, as OpenTelemetry's gRPC spans have it
    (the metric's attribute is its name)."""
    return {**LABELS, "network.transport": "inproc", **extra, "rpc.grpc.status_code": grpc.StatusCode[code].value[0]}


def _metric(code: str) -> dict[str, str]:
    return {**LABELS, "rpc.grpc.status_code": code, "network.transport": "inproc"}


async def test_a_call_that_succeeds(served: Served):
    for _ in range(2):  # the first call builds the method's plan, the second runs on it
        await served.stub(served.service, True).GetProfiles(REQUEST, timeout=10)
        assert _span(served) == (
            "agentlearn.profiles.v1.ProfileService/GetProfiles",
            trace.SpanKind.INTERNAL,
            _attributes("OK", **{"agentlearn.principal": "service", "agentlearn.company": "acme",
                                 "agentlearn.observer": "ana"}),
            trace.StatusCode.UNSET,
        )  # fmt: skip
        assert list(served.inproc_metrics()) == [_metric("OK")]
    # The callee saw the calling service.
    assert served.servicer.principals == [Principal(kind="service", service="agentlearn-prefetch")] * 2
    # A token's call is shed by the server's counters: counted in, and out again.
    token, _ = await served.tokens.issue("acme", ["memory:read"])
    await served.stub(served.engine, True).GetProfiles(REQUEST, timeout=10, metadata=_bearer(token))
    assert _span(served)[2] == _attributes(
        "OK", **{"agentlearn.principal": "token", "agentlearn.company": "acme", "agentlearn.observer": "ana"}
    )
    shedder = local_server(served.address).shedder  # type: ignore[union-attr]
    assert shedder is not None and shedder.in_flight == 0 and not shedder.in_flight_by_company


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def test_a_call_its_credential_does_not_cover_is_refused(served: Served):
    other, _ = await served.tokens.issue("globex", ["memory:read"])
    refusal = await _refused_both_ways(served, served.engine, REQUEST, _bearer(other))
    assert refusal[:4] == (
        grpc.StatusCode.PERMISSION_DENIED,
        "the credential does not grant access to this company, seat or user",
        "CREDENTIAL_SCOPE_MISMATCH",
        "profiles.agentlearn.dev",
    )
    assert _span(served) == (
        "agentlearn.profiles.v1.ProfileService/GetProfiles",
        trace.SpanKind.INTERNAL,
        _attributes("PERMISSION_DENIED"),  # refused before its principal or its request is named
        trace.StatusCode.UNSET,
    )
    assert served.inproc_metrics() == [_metric("PERMISSION_DENIED")]

    writer, _ = await served.tokens.issue("acme", ["memory:write"])
    refusal = await _refused_both_ways(served, served.engine, REQUEST, _bearer(writer))
    assert refusal[2:5] == ("SCOPE_MISSING", "profiles.agentlearn.dev", {"scope": "memory:read"})
    assert _span(served)[2] == _attributes("PERMISSION_DENIED")
    assert served.inproc_metrics() == [_metric("PERMISSION_DENIED")]


async def test_a_call_past_the_servers_limit_is_shed(served: Served):
    token, _ = await served.tokens.issue("acme", ["memory:read"])
    served.servicer.hold = True
    parked = asyncio.ensure_future(
        served.stub(served.engine, True).GetProfiles(REQUEST, timeout=30, metadata=_bearer(token))
    )
    async with asyncio.timeout(30):
        await served.servicer.inside.wait()
    refusal = await _refused_both_ways(served, served.engine, REQUEST, _bearer(token))
    assert refusal[:5] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "the server is running its limit of 1 calls; retry shortly",
        "SERVER_OVERLOADED",
        "profiles.agentlearn.dev",
        {"limit": "1"},
    )
    served.servicer.release.set()
    await parked
    # RESOURCE_EXHAUSTED is retried by the channel's policy: each attempt is one shed call.
    spans = [dict(s.attributes) for s in served.spans()]
    shed = [a for a in spans if a["rpc.grpc.status_code"] != grpc.StatusCode.OK.value[0]]
    assert shed and all(a == _attributes("RESOURCE_EXHAUSTED", **{"agentlearn.principal": "token"}) for a in shed)
    assert (
        spans.count(
            _attributes(
                "OK", **{"agentlearn.principal": "token", "agentlearn.company": "acme", "agentlearn.observer": "ana"}
            )
        )
        == 1
    )
    metrics = served.inproc_metrics()
    assert metrics.count(_metric("OK")) == 1 and metrics.count(_metric("RESOURCE_EXHAUSTED")) == len(shed)
    assert len(metrics) == len(shed) + 1


async def test_a_call_without_a_credential_is_unauthenticated(served: Served):
    refusal = await _refused_both_ways(served, served.engine, REQUEST)
    assert refusal[:4] == (
        grpc.StatusCode.UNAUTHENTICATED,
        "this server requires a bearer token: send metadata 'authorization: Bearer <token>' "
        "(issued by ./run token issue)",
        "CREDENTIAL_MISSING",
        "profiles.agentlearn.dev",
    )
    assert _span(served)[1:] == (trace.SpanKind.INTERNAL, _attributes("UNAUTHENTICATED"), trace.StatusCode.UNSET)
    assert served.inproc_metrics() == [_metric("UNAUTHENTICATED")]


async def test_a_call_breaking_the_contract(served: Served):
    bad = prof_pb.GetProfilesRequest(company="", observer="ana\x00", subjects=[prof_pb.Subject(handle="bob")])
    refusal = await _refused_both_ways(served, served.service, bad)
    assert refusal[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert refusal[2:4] == ("FIELD_REQUIRED", "profiles.agentlearn.dev")
    assert refusal[4]["fields"] == "company,observer,subjects[0].platform"
    assert [f for f, _ in refusal[5]] == ["company", "observer", "observer", "subjects[0].platform"]
    # The service principal is named on the span, and the (non-empty) identities of the request.
    assert _span(served)[2] == _attributes(
        "INVALID_ARGUMENT", **{"agentlearn.principal": "service", "agentlearn.observer": "ana\x00"}
    )
    assert served.inproc_metrics() == [_metric("INVALID_ARGUMENT")]
    assert served.servicer.principals == []  # never reached the servicer


async def test_a_method_not_served_is_unimplemented_with_no_span_or_metric(served: Served):
    local = local_server(served.address)
    assert local is not None
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await local.call("/agentlearn.profiles.v1.ProfileService/NoSuchMethod", REQUEST, (), None)
    assert (exc.value.code(), exc.value.details()) == (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
    assert rpc_status.from_call(exc.value) is None
    assert served.spans() == [] and served.inproc_metrics() == []


async def test_a_method_has_one_plan(served: Served):
    local = local_server(served.address)
    assert local is not None
    assert local.plan("/agentlearn.profiles.v1.ProfileService/NoSuchMethod") is None
    plan = local.plan(METHOD)
    assert plan is not None and local.plan(METHOD) is plan
    assert plan.metric_attributes_of("OK") == _metric("OK")
    assert plan.metric_attributes_of("NOT_A_CODE") == _metric("NOT_A_CODE")


def test_a_trusted_principal_is_authorized_for_any_scope_and_identity():
    """The short cut's premise: ``allows`` and ``check`` pass every trusted principal."""
    named = prof_pb.GetProfilesRequest(company="anyone", observer="any-seat")
    for principal in (LOCAL, Principal(kind="service", service="agentlearn-reflector")):
        assert principal.trusted
        authorize(principal, "/agentlearn.profiles.v1.ProfileService/EraseRows", named)
        assert principal.allows("admin")
        principal.check("anyone", "any-seat", "any-user")


def test_an_instrument_is_created_once():
    from libs.common.metrics import _Lazy

    made: list[str] = []

    class Instrument:
        def record(self, amount: float, attributes: Any = None) -> None:
            made.append("recorded")

    def factory(meter: Any) -> Instrument:
        made.append("created")
        return Instrument()

    lazy = _Lazy(factory)
    for _ in range(3):
        lazy.record(1.0, {"a": "b"})
    assert made == ["created", "recorded", "recorded", "recorded"]
