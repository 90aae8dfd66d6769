"""Channels to the other services, for the calls one service makes on another (the reflector's
fan-out, the prefetch's reads, a pass that reads another service's rows).

In the all-in-one every service is on this process's own server, so the runner points their names
at its own port once it is bound; in split mode and on Kubernetes the addresses come from config
(``services.<name>``). Channels open lazily, carry the trace context and the calling service's
identity, and close with the process.

The identity: on Kubernetes a client certificate over mutual TLS (``services.tls_cert|tls_key|
tls_ca``) to the callee's internal listener; elsewhere the deployment's internal secret in
metadata (``libs.common.auth.INTERNAL_HEADER``), which never leaves the deployment's processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from libs.common import telemetry
from libs.common.auth import INTERNAL_HEADER, SERVICE_HEADER
from libs.common.config import ServiceAddresses
from libs.common.grpcserver import local_port, local_server, local_server_on

__all__ = ["IdentityInterceptor", "InProcessChannel", "ServiceChannels"]

_TLS_FIELDS = ("tls_cert", "tls_key", "tls_ca")
WIRE_CALLS_ENV = "AGL_WIRE_CALLS"  # not AGENTLEARN_*: that prefix is the config's


class IdentityInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds the internal secret and the caller's service name to every outgoing call."""

    def __init__(self, secret: str, service: str):
        self._extra = ((INTERNAL_HEADER, secret), (SERVICE_HEADER, service))

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._extra)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


# Every channel retries a call that failed for a passing reason, by gRPC's own retry policy:
# UNAVAILABLE (the service is down or restarting: nothing was processed), RESOURCE_EXHAUSTED
# (shedding load, or a limit: a refusal before any write, so a retry is safe), and a
# DEADLINE_EXCEEDED the *server* reported. Up to five attempts, backing off from 0.1 s to 2 s, all
# inside the call's own deadline (a call whose own deadline passed is never retried: the deadline
# spans every attempt). The writes the services make on one another carry idempotency keys, so a
# retried write lands once. Throttling stops retrying a service that keeps failing (retries resume
# with its first successes); what still fails is the caller's to handle (the reflector re-queues
# the turn). Calls spread over every address a name resolves to (round robin over a headless
# Service's pods).
SERVICE_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{}],  # every method of every service
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"],
            },
        }
    ],
    # Each failed attempt costs a token, each success gives back a tenth; below half the tokens the
    # channel stops retrying, so an outage does not multiply the calls on a struggling service.
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
}
CHANNEL_OPTIONS = [
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    ("grpc.enable_retries", 1),
    ("grpc.service_config_disable_resolution", 1),  # ours, not one a DNS TXT record might carry
]


_RETRY = SERVICE_CONFIG["methodConfig"][0]["retryPolicy"]
_RETRYABLE = frozenset(grpc.StatusCode[c] for c in _RETRY["retryableStatusCodes"])
_THROTTLE: dict[str, float] = SERVICE_CONFIG["retryThrottling"]
# The retry policy as numbers, read once (not out of the JSON-shaped config on every call).
_MAX_ATTEMPTS = int(_RETRY["maxAttempts"])
_INITIAL_BACKOFF = float(_RETRY["initialBackoff"].rstrip("s"))
_MAX_BACKOFF = float(_RETRY["maxBackoff"].rstrip("s"))
_BACKOFF_MULTIPLIER = _RETRY["backoffMultiplier"]


class _Throttle:
    """gRPC's retry throttling, for in-process calls: a failure costs a token, a success gives
    back ``tokenRatio``; below half the tokens nothing is retried."""

    def __init__(self) -> None:
        self.tokens = float(_THROTTLE["maxTokens"])

    def failed(self) -> bool:
        """Count a failure; True when a retry is still allowed."""
        self.tokens = max(0.0, self.tokens - 1)
        return self.tokens > _THROTTLE["maxTokens"] / 2

    def succeeded(self) -> None:
        self.tokens = min(float(_THROTTLE["maxTokens"]), self.tokens + _THROTTLE["tokenRatio"])


class _LocalUnaryUnary:
    """One RPC of an :class:`InProcessChannel` (what a generated stub holds per method)."""

    def __init__(self, channel: InProcessChannel, method: str, serializer: Any, deserializer: Any, registered: bool):
        self._channel = channel
        self._method = method
        self._wire_args = (method, serializer, deserializer, registered)

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._channel.call(self._method, request, timeout, metadata, self._wire_args)


class InProcessChannel:
    """A channel to a service this process serves (the all-in-one): a stub's call awaits the
    servicer directly through :class:`libs.common.grpcserver.LocalServer` — no serialisation,
    HTTP/2, interceptor chains or client/server span pair — and keeps what the hop guarantees: the
    caller's service identity (the internal secret the wire would carry, checked by the callee's
    authenticator), the RPC's scope, the request contract, the deadline (DEADLINE_EXCEEDED, the
    callee cancelled), cancellation, the channel's retry policy and throttling, the trace (one
    internal span) and every refusal as the AioRpcError the wire raises, with the same ErrorInfo
    and BadRequest. Messages are handed over, not copied: neither side mutates a message it did not
    build. When the server has stopped, calls go over the wire like any channel's."""

    def __init__(self, target: str, identity: Sequence[tuple[str, str]], wire: Callable[[], grpc.aio.Channel]):
        self._target = target
        self._port = local_port(target)  # parsed once; the server on it is looked up per call
        self._identity = tuple(identity)
        self._wire = wire
        self._throttle = _Throttle()

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> _LocalUnaryUnary:
        return _LocalUnaryUnary(self, method, request_serializer, response_deserializer, _registered_method)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._wire().unary_stream(*args, **kwargs)  # no streaming RPC is served in-process

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._wire().stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._wire().stream_stream(*args, **kwargs)

    async def close(self, grace: float | None = None) -> None:
        return None

    async def call(
        self, method: str, request: Any, timeout: float | None, metadata: Any, wire_args: tuple[Any, ...]
    ) -> Any:
        local = local_server_on(self._port)
        if local is None:  # stopped (or never started here): the address is all there is
            return await self._wire().unary_unary(*wire_args)(request, timeout=timeout, metadata=metadata)
        sent = (*((k.lower(), v) for k, v in metadata), *self._identity) if metadata else self._identity
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        backoff = _INITIAL_BACKOFF
        try:
            async with asyncio.timeout_at(deadline):
                for attempt in range(1, _MAX_ATTEMPTS + 1):
                    try:
                        response = await local.call(method, request, sent, deadline)
                    except grpc.aio.AioRpcError as err:
                        if err.code() not in _RETRYABLE or attempt == _MAX_ATTEMPTS or not self._throttle.failed():
                            raise
                    else:
                        self._throttle.succeeded()
                        return response
                    await asyncio.sleep(random.uniform(0, backoff))  # gRPC's jittered backoff
                    backoff = min(backoff * _BACKOFF_MULTIPLIER, _MAX_BACKOFF)
        except TimeoutError:
            # The caller's own deadline, as the wire reports it (never retried: it spans every attempt).
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "Deadline Exceeded",
                "in-process call",
            ) from None
        raise AssertionError("unreachable: the last attempt raises")


class ServiceChannels:
    def __init__(self, addresses: ServiceAddresses, *, internal_secret: str | None = None, caller: str = "agentlearn"):
        dumped = addresses.model_dump()
        self._addresses: dict[str, str] = {k: v for k, v in dumped.items() if k not in _TLS_FIELDS}
        self._tls = (
            grpc.ssl_channel_credentials(
                root_certificates=Path(addresses.tls_ca).read_bytes() if addresses.tls_ca else None,
                private_key=Path(addresses.tls_key).read_bytes(),
                certificate_chain=Path(addresses.tls_cert).read_bytes(),
            )
            if addresses.tls_cert and addresses.tls_key
            else None
        )
        self._identity = [IdentityInterceptor(internal_secret, caller)] if internal_secret else []
        self._identity_metadata = (
            ((INTERNAL_HEADER, internal_secret), (SERVICE_HEADER, caller)) if internal_secret else ()
        )
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._in_process: dict[str, InProcessChannel] = {}
        self._local: set[str] = set()
        self.in_process = os.environ.get(WIRE_CALLS_ENV, "") != "1"
        """Call a service this process serves in-process (``serve_locally``) rather than over
        loopback gRPC; off (or ``AGL_WIRE_CALLS=1`` in the environment: the whole test suite
        over the wire), every call takes the wire (an A/B, or to debug the transport)."""

    def serve_locally(self, names: list[str], address: str) -> None:
        """Route ``names`` to this process's own server (all-in-one, tests): in-process while that
        server is serving (``InProcessChannel``), else plaintext loopback with the internal secret,
        whatever the Kubernetes certificates say."""
        for name in names:
            self._addresses[name] = address
            self._local.add(address)

    def address(self, name: str) -> str:
        return self._addresses[name]

    def channel(self, name: str) -> grpc.aio.Channel:
        target = self._addresses[name]
        if self.in_process and target in self._local and local_server(target) is not None:
            local = self._in_process.get(target)
            if local is None:
                local = InProcessChannel(target, self._identity_metadata, lambda: self._wire(target))
                self._in_process[target] = local
            return local  # type: ignore[return-value]  # duck-typed: has every grpc.aio.Channel method the stubs call
        return self._wire(target)

    def _wire(self, target: str) -> grpc.aio.Channel:
        chan = self._channels.get(target)
        if chan is None:
            interceptors = [*telemetry.client_interceptors(), *self._identity]
            if self._tls is not None and target not in self._local:
                chan = grpc.aio.secure_channel(target, self._tls, interceptors=interceptors, options=CHANNEL_OPTIONS)
            else:
                chan = grpc.aio.insecure_channel(target, interceptors=interceptors, options=CHANNEL_OPTIONS)
            self._channels[target] = chan
        return chan

    async def close(self) -> None:
        for chan in self._channels.values():
            await chan.close()
        self._channels.clear()
