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
            # Spread calls over every address a name resolves to (a headless Service's pods).
            options = [("grpc.lb_policy_name", "round_robin")]
            if self._tls is not None and target not in self._local:
                chan = grpc.aio.secure_channel(target, self._tls, interceptors=interceptors, options=options)
            else:
                chan = grpc.aio.insecure_channel(target, interceptors=interceptors, options=options)
            self._channels[target] = chan
        return chan

    async def close(self) -> None:
        for chan in self._channels.values():
            await chan.close()
        self._channels.clear()
