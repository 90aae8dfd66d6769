"""Every metric agentlearn records, in one place, through the OpenTelemetry metrics API.

The meter provider (``telemetry.configure_metrics``) exports them by OTLP when configured and
always to Prometheus, served at ``/metrics`` on the HTTP port (:func:`prometheus_app`). Names
follow the semantic conventions where one exists (``rpc.server.duration``); ours are namespaced
``agentlearn.*``. Recording is best-effort and cheap: an instrument with no provider installed is a
no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import metrics

if TYPE_CHECKING:  # only for the annotation: starlette loads with the HTTP server
    from starlette.types import ASGIApp

__all__ = [
    "AUX_TOKENS",
    "EMBED_BATCH",
    "EMBED_DURATION",
    "FILL_BACKLOG",
    "LEARNING_CHECKS",
    "PREFETCH_BLOCKS",
    "QUEUE_DEPTH",
    "QUEUE_LAG",
    "RPC_DURATION",
    "WORKER_OUTCOMES",
    "prometheus_app",
    "record_queue_depth",
    "record_queue_lag",
]

_log = logging.getLogger(__name__)


class _Lazy:
    """An instrument created on first use, then kept: created before ``configure_metrics`` installs
    the provider, it is the API's proxy instrument, which the API binds to the provider once one is
    installed (a provider is installed at most once a process), so looking the provider up again
    on every recording (an environment read while none is installed) bought nothing."""

    def __init__(self, factory: Callable[[metrics.Meter], Any]):
        self._factory = factory
        self._instrument: Any = None

    def _get(self) -> Any:
        instrument = self._instrument
        if instrument is None:
            instrument = self._instrument = self._factory(metrics.get_meter("agentlearn"))
        return instrument

    def add(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        self._get().add(amount, attributes=attributes)

    def record(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        self._get().record(amount, attributes=attributes)

    def set(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        self._get().set(amount, attributes=attributes)


def _histogram(name: str, unit: str, description: str) -> _Lazy:
    return _Lazy(lambda m: m.create_histogram(name, unit=unit, description=description))


def _counter(name: str, unit: str, description: str) -> _Lazy:
    return _Lazy(lambda m: m.create_counter(name, unit=unit, description=description))


def _gauge(name: str, unit: str, description: str) -> _Lazy:
    return _Lazy(lambda m: m.create_gauge(name, unit=unit, description=description))


RPC_DURATION = _histogram(
    "rpc.server.duration", "ms", "Duration of inbound RPCs, per method and status code (gRPC semantic conventions)"
)
"""Attributes: ``rpc.system`` (grpc), ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``."""

QUEUE_DEPTH = _gauge("agentlearn.queue.depth", "{job}", "Jobs waiting or running in the durable queue, per kind")
"""Attributes: ``agentlearn.job.kind`` (reflection, learning, erasure). The reflector's HPA scales
on it. A worker records it with :func:`record_queue_depth`."""

QUEUE_LAG = _histogram("agentlearn.queue.lag", "s", "Time from enqueue to claim of a job, per kind")
"""Attributes: ``agentlearn.job.kind``. A worker records it with :func:`record_queue_lag`."""

WORKER_OUTCOMES = _counter("agentlearn.reflection.worker.outcomes", "{outcome}", "Reflection worker outcomes")
"""Attributes: ``agentlearn.worker``, ``agentlearn.worker.status``."""

FILL_BACKLOG = _gauge("agentlearn.fill.backlog", "{row}", "Rows waiting for a vector of the current model")
"""Attributes: ``agentlearn.fill.source`` (notes, episodes, pages)."""

EMBED_BATCH = _histogram("agentlearn.embedding.batch.size", "{text}", "Texts per embedding model run")

EMBED_DURATION = _histogram("agentlearn.embedding.duration", "s", "Duration of one embedding model run")

AUX_TOKENS = _counter("agentlearn.auxiliary.tokens", "{token}", "Auxiliary-model tokens spent")
"""Attributes: ``agentlearn.purpose``, ``agentlearn.stage``, ``agentlearn.model``."""

PREFETCH_BLOCKS = _counter("agentlearn.prefetch.blocks", "{block}", "Turn-start blocks rendered, by block and hit")
"""Attributes: ``agentlearn.block``, ``agentlearn.hit`` (true/false). Hit rate = hit / all."""

LEARNING_CHECKS = _counter("agentlearn.learning_checks", "{check}", "Session learning checks finished, by outcome")
"""Attributes: ``agentlearn.trigger``, ``agentlearn.outcome``."""


class _Claimed(Protocol):
    """A claimed job as the lag needs it (``libs.common.jobs.Job``)."""

    @property
    def attempts(self) -> int: ...

    @property
    def create_time(self) -> datetime: ...


def record_queue_lag(kind: str, job: _Claimed, now: datetime) -> None:
    """``agentlearn.queue.lag`` of a job of ``kind`` just claimed: enqueue to its first claim (a
    retry's wait is its backoff, not lag, so a later claim records nothing)."""
    if job.attempts == 1:
        QUEUE_LAG.record(max(0.0, (now - job.create_time).total_seconds()), {"agentlearn.job.kind": kind})


async def record_queue_depth(kind: str, pending: Callable[[str], Awaitable[int]]) -> None:
    """``agentlearn.queue.depth`` of ``kind``: ``pending(kind)`` (``JobQueue.pending``: jobs queued or
    running). Best-effort: a queue that does not answer is logged at debug and the gauge keeps its
    last value; the worker's own read of the queue reports the fault."""
    try:
        depth = await pending(kind)
    except Exception as exc:
        _log.debug("%s queue depth unreadable: %s", kind, exc)
        return
    QUEUE_DEPTH.set(depth, {"agentlearn.job.kind": kind})


def prometheus_app() -> ASGIApp:
    """An ASGI app serving the Prometheus exposition of this process's metrics (``/metrics``)."""
    from prometheus_client import make_asgi_app

    return make_asgi_app()
