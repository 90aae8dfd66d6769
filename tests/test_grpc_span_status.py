"""A call's span says how it ended, over the wire and in-process alike: ``rpc.grpc.status_code`` is
the status's number, and the span's status is ERROR for a server fault (UNKNOWN, DEADLINE_EXCEEDED,
UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS: OpenTelemetry's gRPC semantic conventions), UNSET
for a refusal of the caller's request. Our interceptors answer with ``abort_with_status``, which
OpenTelemetry's server interceptor does not see: without marking the span themselves, every refusal
and every INTERNAL read as OK.

Real server on loopback (the ``served`` fixture of the fast-path tests: a PostgreSQL token store,
the server's shedder, the OpenTelemetry SDK with an in-memory exporter)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from opentelemetry import trace

from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from libs.common.errors import Unavailable
from tests import test_inprocess_fast_path as fast_path
from tests.test_inprocess_fast_path import REQUEST, Served, _bearer

served = fast_path.served
"""The fast-path tests' server (a fixture)."""

WIRE = "/agentlearn.profiles.v1.ProfileService/GetProfiles"
INPROC = "agentlearn.profiles.v1.ProfileService/GetProfiles"


async def _ended(served: Served) -> list[tuple[str, Any, Any]]:
    """(how the call was made, ``rpc.grpc.status_code``, span status) of each call's span since the
    last look: the wire's server span and the in-process call's span. The wire's server span ends
    after the client has its answer (the server finishes the call on its own loop turn), so this
    waits for both, bounded, rather than reading the exporter at once."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        out = []
        for s in served.exporter.get_finished_spans():
            attrs = s.attributes or {}
            if s.name == WIRE and s.kind is trace.SpanKind.SERVER:
                out.append(("wire", attrs.get("rpc.grpc.status_code"), s.status.status_code))
            elif s.name == INPROC and attrs.get("network.transport") == "inproc":
                out.append(("inproc", attrs.get("rpc.grpc.status_code"), s.status.status_code))
        if {k for k, _, _ in out} >= {"wire", "inproc"} or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.01)
    served.exporter.clear()
    return sorted(out, key=lambda x: x[0])


async def _both_ways(served: Served, request: Any, metadata: Any = (), *, channels: Any = None) -> grpc.StatusCode:
    codes = set()
    for in_process in (True, False):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            stub = served.stub(channels or served.engine, in_process)
            await stub.GetProfiles(request, timeout=10, metadata=metadata)
        codes.add(exc.value.code())
    [code] = codes
    return code


async def test_a_refusal_is_its_code_and_no_error(served: Served) -> None:
    # Refused by the authenticator (AuthInterceptor): no credential.
    assert await _both_ways(served, REQUEST) is grpc.StatusCode.UNAUTHENTICATED
    assert await _ended(served) == [("inproc", 16, trace.StatusCode.UNSET), ("wire", 16, trace.StatusCode.UNSET)]
    # Refused by the contract (ErrorInterceptor).
    bad = prof_pb.GetProfilesRequest(company="", observer="ana", subjects=[prof_pb.Subject(handle="bob")])
    assert await _both_ways(served, bad, channels=served.service) is grpc.StatusCode.INVALID_ARGUMENT
    assert await _ended(served) == [("inproc", 3, trace.StatusCode.UNSET), ("wire", 3, trace.StatusCode.UNSET)]


async def test_a_shed_call_is_resource_exhausted_and_no_error(served: Served) -> None:
    token, _ = await served.tokens.issue("acme", ["memory:read"])
    served.servicer.hold = True
    parked = asyncio.ensure_future(
        served.stub(served.engine, False).GetProfiles(REQUEST, timeout=30, metadata=_bearer(token))
    )
    async with asyncio.timeout(30):
        await served.servicer.inside.wait()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await served.stub(served.engine, False).GetProfiles(REQUEST, timeout=10, metadata=_bearer(token))
    assert exc.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    served.servicer.release.set()
    await parked
    ended = await _ended(served)
    # RESOURCE_EXHAUSTED is retried by the channel's policy: each attempt is one shed call.
    assert ended.count(("wire", 0, trace.StatusCode.UNSET)) == 1
    shed = [e for e in ended if e[1] != 0]
    assert shed and set(shed) == {("wire", 8, trace.StatusCode.UNSET)}


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (RuntimeError("kaboom"), grpc.StatusCode.INTERNAL),
        (Unavailable("the store is down", reason="STORE_UNAVAILABLE"), grpc.StatusCode.UNAVAILABLE),
    ],
)
async def test_a_server_fault_is_its_code_and_an_error(
    served: Served, monkeypatch: pytest.MonkeyPatch, raised: Exception, code: grpc.StatusCode
) -> None:
    class Failing(list[Any]):
        """The servicer's record of its callers, which fails: the handler raises ``raised`` (its
        method was bound when the server started, so it is its first step that fails)."""

        def append(self, item: Any) -> None:
            raise raised

    monkeypatch.setattr(served.servicer, "principals", Failing())
    # Tried once each way: the channel's retry policy may retry UNAVAILABLE, each attempt a span.
    assert await _both_ways(served, REQUEST, channels=served.service) is code
    ended = await _ended(served)
    assert set(ended) == {
        ("inproc", code.value[0], trace.StatusCode.ERROR),
        ("wire", code.value[0], trace.StatusCode.ERROR),
    }
