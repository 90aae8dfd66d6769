"""``agentlearn.queue.depth`` and ``agentlearn.queue.lag`` for every queue family, not only the
reflector's: the erasure worker samples its queue's depth on each drain and records each job's lag
(enqueue to first claim) through ``libs.common.metrics``' helpers.

Real services on loopback gRPC, real PostgreSQL; the instruments are stood in for by recorders
(what each recording was given), as the fast-path tests do for ``rpc.server.duration``."""

from __future__ import annotations

from typing import Any

import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from libs.common import metrics
from tests.support.app import open_app
from tests.test_inprocess_fast_path import Recorder
from tests.test_privacy import NAMES, Env

pytestmark = pytest.mark.timeout(300)


class Gauge:
    def __init__(self) -> None:
        self.seen: list[tuple[float, dict[str, Any]]] = []

    def set(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
        self.seen.append((amount, dict(attributes or {})))


def test_a_later_claim_records_no_lag(monkeypatch: pytest.MonkeyPatch, clock: Any) -> None:
    """A retry's wait is its backoff, not lag: only a job's first claim is recorded."""
    lag = Recorder()
    monkeypatch.setattr(metrics, "QUEUE_LAG", lag)

    class Job:
        def __init__(self, attempts: int) -> None:
            self.attempts, self.create_time = attempts, clock.now()

    first, retried = Job(1), Job(2)
    clock.advance(seconds=7)
    metrics.record_queue_lag("learning", retried, clock.now())
    metrics.record_queue_lag("learning", first, clock.now())
    assert lag.seen == [{"agentlearn.job.kind": "learning"}]


async def test_the_erasure_worker_records_its_queues_depth_and_lag(
    make_settings: Any, dsn: str, clock: Any, local_embedder: Any, edge_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    depth, lags = Gauge(), []

    class Lag:
        def record(self, amount: float, attributes: dict[str, Any] | None = None) -> None:
            lags.append((amount, dict(attributes or {})))

    monkeypatch.setattr(metrics, "QUEUE_DEPTH", depth)
    monkeypatch.setattr(metrics, "QUEUE_LAG", Lag())
    kind = {"agentlearn.job.kind": "erasure"}
    async with open_app(
        make_settings(), dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index
    ) as app:
        env = Env(app)  # type: ignore[no-untyped-call]
        await env.worker.drain()
        assert depth.seen[-1] == (0, kind)  # an empty queue reads 0
        await env.privacy.EraseSubject(
            pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(handle="bob", platform="slack"))
        )
        clock.advance(seconds=5)
        depth.seen.clear()
        assert await env.worker.drain() == 1
        assert depth.seen[0] == (1, kind)  # one job queued when the drain began
        assert lags == [(5.0, kind)]
        await env.worker.drain()
        assert depth.seen[-1] == (0, kind)
