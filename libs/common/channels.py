"""Channels to the other services, for the calls one service makes on another (the reflector's
fan-out, the prefetch's reads, a pass that reads another service's rows).

In the all-in-one every service is on this process's own server, so the runner points their names
at its own port once it is bound; in split mode and on Kubernetes the addresses come from config
(``services.<name>``). Channels open lazily, carry the trace context, and close with the process.
"""

from __future__ import annotations

import grpc

from libs.common import telemetry
from libs.common.config import ServiceAddresses

__all__ = ["ServiceChannels"]


class ServiceChannels:
    def __init__(self, addresses: ServiceAddresses):
        self._addresses: dict[str, str] = addresses.model_dump()
        self._channels: dict[str, grpc.aio.Channel] = {}

    def serve_locally(self, names: list[str], address: str) -> None:
        """Route ``names`` to this process's own server (all-in-one, tests)."""
        for name in names:
            self._addresses[name] = address

    def address(self, name: str) -> str:
        return self._addresses[name]

    def channel(self, name: str) -> grpc.aio.Channel:
        target = self._addresses[name]
        chan = self._channels.get(target)
        if chan is None:
            chan = grpc.aio.insecure_channel(
                target,
                interceptors=telemetry.client_interceptors(),
                # Spread calls over every address a name resolves to (a headless Service's pods).
                options=[("grpc.lb_policy_name", "round_robin")],
            )
            self._channels[target] = chan
        return chan

    async def close(self) -> None:
        for chan in self._channels.values():
            await chan.close()
        self._channels.clear()
