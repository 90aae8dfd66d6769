"""Channels to the other services, for the calls one service makes on another (the reflector's
fan-out, the prefetch's reads, a pass that reads another service's rows).

In the all-in-one every service is on this process's own server, so the runner points their names
at its own port once it is bound; in split mode and on Kubernetes the addresses come from config
(``services.<name>``). Channels open lazily, carry the trace context, and close with the process.
"""

from __future__ import annotations

import json

import grpc

from libs.common import telemetry
from libs.common.config import ServiceAddresses

__all__ = ["ServiceChannels"]

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
                options=CHANNEL_OPTIONS,  # retries and round robin (SERVICE_CONFIG)
            )
            self._channels[target] = chan
        return chan

    async def close(self) -> None:
        for chan in self._channels.values():
            await chan.close()
        self._channels.clear()
