"""Calls between services of one process (the all-in-one) are in-process: the stub awaits the
servicer, yet the caller sees what the wire gives it — the same refusal (code, message, ErrorInfo,
BadRequest field), the callee sees the caller's service principal and the deadline — and no
network connection is opened for them. Real servers on loopback, real PostgreSQL; the wire side of
each comparison is the same ServiceChannels with in-process calls turned off."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as prof_grpc
from libs.common.auth import current_principal
from libs.common.channels import ServiceChannels
from libs.common.clients import Clients
from libs.common.config import ServiceAddresses
from libs.common.grpcserver import Registration, create_server
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.test_prefetch_support import default_settings, open_env


def _refusal(err: grpc.aio.AioRpcError) -> tuple:
    """Everything a caller can read of a refusal."""
    code, info, bad = error_info(err)
    fields = [(v.field, v.description) for v in bad.field_violations] if bad is not None else []
    assert info is not None, "every refusal carries an ErrorInfo"
    return code, err.details(), info.reason, info.domain, dict(info.metadata), fields


async def _both_ways(channels: ServiceChannels, call) -> tuple[tuple, tuple]:  # type: ignore[no-untyped-def]
    """The refusal of ``call`` in-process, then over the wire (same channels, same identity)."""
    out = []
    for in_process in (True, False):
        channels.in_process = in_process
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call(Clients(channels, 10.0))
        out.append(_refusal(exc.value))
    channels.in_process = True
    return out[0], out[1]


@pytest.mark.parametrize(
    "request_",
    [
        # the contract (protovalidate): every violated field at once
        diary_pb.WriteNoteRequest(company="", seat="", content="x"),
        # the handler's own refusal with a field
        diary_pb.GetNoteRequest(company="acme", seat="ana", note_id="not-a-uuid"),
        # the store's answer
        diary_pb.GetNoteRequest(company="acme", seat="ana", note_id="00000000-0000-4000-8000-000000000000"),
    ],
    ids=["contract", "handler", "not-found"],
)
async def test_a_refusal_crossing_an_in_process_hop_is_the_one_the_wire_carries(
    make_settings, dsn, clock, edge_index, request_
):
    async with open_app(make_settings(), dsn, clock=clock, names=["diary"], embedder=None, index=edge_index) as app:
        method = "WriteNote" if isinstance(request_, diary_pb.WriteNoteRequest) else "GetNote"

        async def call(clients: Clients):  # type: ignore[no-untyped-def]
            return await getattr(clients.diary, method)(request_, timeout=clients.timeout)

        local, wire = await _both_ways(app.infra.channels, call)
        assert local == wire
        assert local[0] in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


async def test_an_authentication_refusal_is_the_same_in_process(make_settings, dsn, clock, edge_index):
    """A caller without the deployment's secret is refused by the callee's authenticator in-process
    exactly as over the wire (tokens mode: UNAUTHENTICATED, CREDENTIAL_MISSING)."""
    async with open_app(
        make_settings(), dsn, clock=clock, names=["diary"], embedder=None, index=edge_index, auth_mode="tokens"
    ) as app:
        stranger = ServiceChannels(ServiceAddresses(), internal_secret="not-the-secret", caller="stranger")
        stranger.serve_locally(["diary"], f"127.0.0.1:{app.port}")
        try:
            local, wire = await _both_ways(
                stranger,
                lambda c: c.diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"), timeout=c.timeout),
            )
        finally:
            await stranger.close()
        assert local == wire and local[0] == grpc.StatusCode.UNAUTHENTICATED
        # The deployment's own channels pass: the callee saw a service principal.
        resp = await Clients(app.infra.channels, 10).diary.ListNotes(
            diary_pb.ListNotesRequest(company="acme", seat="ana"), timeout=10
        )
        assert resp.total_size == 0


class RecordingProfiles(prof_grpc.ProfileServiceServicer):
    """A profiles service that records who called it and the time it was given, and can be slow."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, bool]] = []
        self.delay = 0.0
        self.cancelled = asyncio.Event()

    async def GetProfiles(self, request, context):  # type: ignore[no-untyped-def]
        p = current_principal()
        remaining = context.time_remaining()
        self.seen.append(
            (p.kind, p.service, remaining is not None and 0 < remaining <= 6)
        )  # the wire rounds the grpc-timeout up
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return prof_pb.GetProfilesResponse()


@contextlib.asynccontextmanager
async def _recording_profiles(**server: Any) -> AsyncIterator[tuple[RecordingProfiles, ServiceChannels]]:
    """A recording profiles service on loopback (``server``: create_server's options), reached
    through the channels of a prefetch that serves it locally (in-process unless turned off)."""
    servicer = RecordingProfiles()
    reg = Registration(
        "agentlearn.profiles.v1.ProfileService", prof_grpc.add_ProfileServiceServicer_to_server, servicer
    )
    grpc_server, port, _ = await create_server([reg], "127.0.0.1:0", **server)
    channels = ServiceChannels(ServiceAddresses(), internal_secret="s3cret", caller="agentlearn-prefetch")
    try:
        channels.serve_locally(["profiles"], f"127.0.0.1:{port}")
        yield servicer, channels
    finally:
        await channels.close()
        await grpc_server.stop(None)


PROFILES_REQUEST = prof_pb.GetProfilesRequest(
    company="acme", observer="ana", subjects=[prof_pb.Subject(handle="bob", platform="slack")]
)


async def _call_both_ways(channels: ServiceChannels) -> None:
    """PROFILES_REQUEST in-process, then over the wire."""
    for in_process in (True, False):
        channels.in_process = in_process
        await Clients(channels, 5).profiles.GetProfiles(PROFILES_REQUEST, timeout=5)


async def test_the_callee_sees_the_callers_identity_and_deadline_and_is_cancelled_at_it():
    # create_server's local authenticator knows no secret: both ways the callee sees LOCAL
    async with _recording_profiles() as (servicer, channels):
        await _call_both_ways(channels)
        assert servicer.seen[0] == servicer.seen[1] == ("local", None, True)

        # the deadline: DEADLINE_EXCEEDED for the caller, the callee cancelled
        servicer.delay = 30
        channels.in_process = True
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await Clients(channels, 5).profiles.GetProfiles(PROFILES_REQUEST, timeout=0.3)
        assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        async with asyncio.timeout(5):
            await servicer.cancelled.wait()


async def test_the_callee_sees_the_calling_service_in_tokens_mode():
    from libs.common.auth import Authenticator
    from libs.common.clock import SystemClock

    auth = Authenticator(None, SystemClock(), mode="tokens", internal_secret="s3cret")
    async with _recording_profiles(authenticator=auth) as (servicer, channels):
        await _call_both_ways(channels)
        assert servicer.seen[0] == servicer.seen[1] == ("service", "agentlearn-prefetch", True)


def _established(port: int) -> int:
    """TCP connections of this machine with an end on ``port`` (each counted from both ends)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and port in (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)):
                count += 1
    return count


def _inproc_samples(exposition: str, method: str) -> tuple[float, float]:
    """(wire, in-process) call counts of ``method`` in ``rpc.server.duration``."""
    wire = local = 0.0
    for line in exposition.splitlines():
        if line.startswith("rpc_server_duration_milliseconds_count") and f'rpc_method="{method}"' in line:
            value = float(line.rsplit(" ", 1)[1])
            if 'network_transport="inproc"' in line:
                local += value
            else:
                wire += value
    return wire, local


async def test_a_turn_start_in_the_all_in_one_opens_no_connection_for_its_inner_calls(
    make_settings, dsn, clock, local_embedder, edge_index
):
    from prometheus_client import generate_latest

    from libs.common import telemetry
    from libs.common.config import TelemetryConfig

    telemetry.configure_metrics(TelemetryConfig())
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as env:
        env.app.infra.channels.in_process = True  # the default (whatever AGL_WIRE_CALLS says for the suite)
        await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
        await env.skill("billing-digest", "Export billing and post the weekly digest to the requester")
        port = env.app.port
        before = generate_latest().decode()
        resp = await env.build("Can you send Bob the weekly billing export digest?", turn_id="inproc-1")
        assert any(b.hit for b in resp.blocks)
        after = generate_latest().decode()
        # One connection: the test's own channel. The prefetch's reads of the diary, the episodes,
        # the skills and the profiles opened none.
        assert _established(port) == 2
        for method in ("RecallNotes", "ListSkills", "SearchEpisodes", "MarkNotesUsed"):
            wire_before, local_before = _inproc_samples(before, method)
            wire_after, local_after = _inproc_samples(after, method)
            assert wire_after == wire_before, method  # the callee's server saw no wire call
            assert local_after == local_before + 1, method  # ...and served it in-process

        # The control: with in-process calls off the same turn start opens a connection of its own.
        env.app.infra.channels.in_process = False
        await env.build("Can you send Bob the weekly billing export digest?", turn_id="inproc-2")
        assert _established(port) == 4
        recall_before, _ = _inproc_samples(after, "RecallNotes")
        recall_after, _ = _inproc_samples(generate_latest().decode(), "RecallNotes")
        assert recall_after == recall_before + 1
