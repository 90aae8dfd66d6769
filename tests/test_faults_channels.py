"""The channels between services under a failing peer: gRPC's retry policy retries what failed for
a passing reason, inside the call's deadline, and nothing else; calls spread round robin; and the
reflector tells a server shedding load (RetryInfo) from a limit. The peer is a real gRPC server on
loopback that fails on cue."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.channels import ServiceChannels
from libs.common.clients import Clients
from libs.common.config import ServiceAddresses
from services.reflector.domain import RETRYABLE_FAILURES
from services.reflector.workers.base import failure_kind


class FlakyDiary:
    """ListNotes that fails with the scripted codes in order, then answers."""

    def __init__(self, failures: list[grpc.StatusCode | grpc.Status]):
        self.failures = list(failures)
        self.calls = 0

    async def list_notes(self, request, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, grpc.StatusCode):
                await context.abort(failure, "scripted failure")
            await context.abort_with_status(failure)
        return diary_pb.ListNotesResponse(total_size=self.calls)


async def _serve(diary: FlakyDiary) -> tuple[grpc.aio.Server, str]:
    handler = grpc.method_handlers_generic_handler(
        "agentlearn.diary.v1.DiaryService",
        {
            "ListNotes": grpc.unary_unary_rpc_method_handler(
                diary.list_notes,
                request_deserializer=diary_pb.ListNotesRequest.FromString,
                response_serializer=diary_pb.ListNotesResponse.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def channels():
    chans = ServiceChannels(ServiceAddresses())
    yield chans
    await chans.close()


async def _call(channels: ServiceChannels, target: str, timeout: float = 10.0) -> diary_pb.ListNotesResponse:
    channels.serve_locally(["diary"], target)
    clients = Clients(channels, timeout)
    return await clients.diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"), timeout=clients.timeout)


@pytest.mark.parametrize(
    "failures",
    [
        [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE],
        [grpc.StatusCode.RESOURCE_EXHAUSTED],
        [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED],
    ],
)
async def test_a_passing_failure_is_retried_by_the_channel(channels, failures):
    diary = FlakyDiary(failures)
    server, target = await _serve(diary)
    try:
        resp = await _call(channels, target)
        assert diary.calls == len(failures) + 1 and resp.total_size == diary.calls
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED]
)
async def test_an_answer_is_not_retried(channels, code):
    diary = FlakyDiary([code])
    server, target = await _serve(diary)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _call(channels, target)
        assert exc.value.code() == code and diary.calls == 1
    finally:
        await server.stop(None)


async def test_retries_are_bounded_and_the_failure_reaches_the_caller(channels):
    diary = FlakyDiary([grpc.StatusCode.UNAVAILABLE] * 10)
    server, target = await _serve(diary)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _call(channels, target)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and diary.calls == 5
        assert failure_kind(exc.value) in RETRYABLE_FAILURES  # the reflector re-queues the turn
    finally:
        await server.stop(None)


async def test_a_service_that_is_down_fails_unavailable_within_the_deadline(channels, unused_tcp_port):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _call(channels, f"127.0.0.1:{unused_tcp_port}", timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failure_kind(exc.value) == "rpc_unavailable"


def _status(code: int, *details) -> grpc.Status:  # type: ignore[no-untyped-def]
    packed = []
    for d in details:
        any_detail = any_pb2.Any()
        any_detail.Pack(d)
        packed.append(any_detail)
    return rpc_status.to_status(status_pb2.Status(code=code, message="scripted", details=packed))


async def test_load_shedding_is_retryable_and_a_limit_is_final(channels):
    """RESOURCE_EXHAUSTED with RetryInfo (a server shedding load says when to come back) is a
    passing failure; without it (a full catalogue) it is the worker's final answer."""
    shed = _status(code_pb2.RESOURCE_EXHAUSTED, error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=1)))
    limit = _status(
        code_pb2.RESOURCE_EXHAUSTED,
        error_details_pb2.ErrorInfo(reason="SKILL_CATALOGUE_FULL", domain="skills.agentlearn.dev"),
    )
    diary = FlakyDiary([shed] * 5 + [limit] * 5)
    server, target = await _serve(diary)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as shed_exc:
            await _call(channels, target)
        with pytest.raises(grpc.aio.AioRpcError) as limit_exc:
            await _call(channels, target)
        assert failure_kind(shed_exc.value) == "rpc_resource_exhausted"
        assert failure_kind(shed_exc.value) in RETRYABLE_FAILURES
        assert failure_kind(limit_exc.value) == "rpc_limit_reached"
        assert failure_kind(limit_exc.value) not in RETRYABLE_FAILURES
    finally:
        await server.stop(None)


async def test_calls_spread_over_every_address_of_a_name(channels):
    """Round robin is kept: a name resolving to two servers (a headless Service's pods) reaches both."""
    first, second = FlakyDiary([]), FlakyDiary([])
    s1, t1 = await _serve(first)
    s2, t2 = await _serve(second)
    try:
        target = f"ipv4:{t1},{t2}"
        async with asyncio.timeout(20):
            while not (first.calls and second.calls):
                await _call(channels, target)
    finally:
        await s1.stop(None)
        await s2.stop(None)
