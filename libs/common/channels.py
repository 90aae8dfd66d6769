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

import json
from pathlib import Path
from typing import Any

import grpc

from libs.common import telemetry
from libs.common.auth import INTERNAL_HEADER, SERVICE_HEADER
from libs.common.config import ServiceAddresses

__all__ = ["IdentityInterceptor", "ServiceChannels"]

_TLS_FIELDS = ("tls_cert", "tls_key", "tls_ca")


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
SERVICE_CONFIG = {
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
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._local: set[str] = set()

    def serve_locally(self, names: list[str], address: str) -> None:
        """Route ``names`` to this process's own server (all-in-one, tests): plaintext loopback with
        the internal secret, whatever the Kubernetes certificates say."""
        for name in names:
            self._addresses[name] = address
            self._local.add(address)

    def address(self, name: str) -> str:
        return self._addresses[name]

    def channel(self, name: str) -> grpc.aio.Channel:
        target = self._addresses[name]
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
