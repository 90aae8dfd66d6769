"""The Kubernetes lease backend against a scripted API server over real loopback HTTP.

The server keeps Lease objects with resourceVersions and answers GET / POST / PUT the way
kube-apiserver does: 404 for a missing Lease, 409 AlreadyExists on a second create, 409 Conflict
on a replace carrying a stale resourceVersion. Tests can push scripted faults (a status, a raw
body, a delay) and make two readers meet at a barrier so that both read the same version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from libs.common.clock import ManualClock
from libs.common.config import LeaseConfig
from libs.common.infra import open_infra
from libs.common.k8s_leases import IN_CLUSTER_API, KubernetesLeaseClaimer, format_microtime, parse_microtime
from libs.common.passrunner import PassSpec, run_pass
from tests.support.loopback_http import LoopbackHTTP, send_json

NS = "agentlearn"
PREFIX = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


@dataclass
class Fault:
    status: int = 500
    raw: bytes | None = None
    delay: float = 0.0
    method: str | None = None
    """Only a request of this method takes the fault; None: the next request of any method."""


class ScriptedKubeAPI(LoopbackHTTP):
    """Just enough of kube-apiserver's Lease endpoints, with its concurrency semantics."""

    def __init__(self) -> None:
        self.leases: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.faults: deque[Fault] = deque()
        self.get_barrier: threading.Barrier | None = None
        self._version = 100
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def spec(self, name: str) -> dict:
        with self._lock:
            return dict(self.leases[name]["spec"])

    def _status(self, code: int, reason: str, message: str) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": reason,
            "code": code,
            "message": message,
        }

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, Any]:
        if not path.startswith(PREFIX):
            return 404, self._status(404, "NotFound", f"no route {path}")
        name = path[len(PREFIX) :].strip("/")
        with self._lock:
            if method == "GET" and name:
                obj = self.leases.get(name)
                if obj is None:
                    return 404, self._status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
                return 200, obj
            if method == "POST" and not name:
                assert body is not None
                new = body["metadata"]["name"]
                if new in self.leases:
                    return 409, self._status(409, "AlreadyExists", f'leases.coordination.k8s.io "{new}" already exists')
                obj = json.loads(json.dumps(body))
                obj["metadata"].update(resourceVersion=self._next_version(), uid=f"uid-{new}")
                self.leases[new] = obj
                return 201, obj
            if method == "PUT" and name:
                assert body is not None
                current = self.leases.get(name)
                if current is None:
                    return 404, self._status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
                sent = (body.get("metadata") or {}).get("resourceVersion")
                if sent != current["metadata"]["resourceVersion"]:
                    return 409, self._status(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                        "modified; please apply your changes to the latest version and try again",
                    )
                obj = json.loads(json.dumps(body))
                obj["metadata"]["resourceVersion"] = self._next_version()
                self.leases[name] = obj
                return 200, obj
        return 405, self._status(405, "MethodNotAllowed", method)

    def start(self) -> ScriptedKubeAPI:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length)) if length else None
                with owner._lock:
                    owner.requests.append((method, self.path, body))
                    fault = next((f for f in owner.faults if f.method in (None, method)), None)
                    if fault is not None:
                        owner.faults.remove(fault)
                    barrier = owner.get_barrier if method == "GET" else None
                if barrier is not None:
                    barrier.wait(timeout=60)  # a deadline for a broken test, not a pacing
                if fault is not None:
                    time.sleep(fault.delay)
                    status = fault.status
                    payload = (
                        fault.raw
                        if fault.raw is not None
                        else json.dumps(owner._status(status, "x", "scripted")).encode()
                    )
                else:
                    status, obj = owner.handle(method, self.path, body)
                    payload = json.dumps(obj).encode()
                send_json(self, status, payload)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

        self.serve_in_background(Handler)
        return self


@pytest.fixture
def kube():
    server = ScriptedKubeAPI().start()
    yield server
    server.stop()


def claimer(kube: ScriptedKubeAPI, clock: ManualClock, **kw: Any) -> KubernetesLeaseClaimer:
    return KubernetesLeaseClaimer(kube.url, NS, clock, **kw)


async def test_first_claim_creates_the_lease(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    lease = await claimer(kube, clock).claim("diary-fill", "pod-a", 300)
    assert lease is not None
    assert (lease.name, lease.holder, lease.fence) == ("diary-fill", "pod-a", 0)
    assert lease.expire_time == clock.now() + timedelta(seconds=300)
    spec = kube.spec("diary-fill")
    assert spec["holderIdentity"] == "pod-a"
    assert spec["leaseDurationSeconds"] == 300
    assert spec["leaseTransitions"] == 0
    assert spec["renewTime"] == spec["acquireTime"] == format_microtime(clock.now())
    assert spec["renewTime"] == "2026-01-01T00:00:00.000000Z"
    assert [m for m, _, _ in kube.requests] == ["GET", "POST"]


async def test_a_second_holder_is_refused_while_the_lease_is_held(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock)
    assert await k.claim("diary-fill", "pod-a", 300) is not None
    clock.advance(seconds=299)
    assert await k.claim("diary-fill", "pod-b", 300) is None
    assert kube.spec("diary-fill")["holderIdentity"] == "pod-a"
    assert [m for m, _, _ in kube.requests][-1] == "GET"  # no write attempted


async def test_the_holder_renews_without_a_transition(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock)
    first = await k.claim("diary-fill", "pod-a", 300)
    acquired = kube.spec("diary-fill")["acquireTime"]
    clock.advance(seconds=120)
    again = await k.claim("diary-fill", "pod-a", 300)
    assert again is not None and first is not None
    assert again.fence == first.fence == 0
    spec = kube.spec("diary-fill")
    assert spec["renewTime"] == format_microtime(clock.now())
    assert spec["acquireTime"] == acquired
    put = [b for m, _, b in kube.requests if m == "PUT"][-1]
    assert put is not None and put["metadata"]["resourceVersion"] == "101"  # the version it read


async def test_an_expired_lease_is_taken_over_with_one_more_transition(
    kube: ScriptedKubeAPI, clock: ManualClock
) -> None:
    k = claimer(kube, clock)
    assert await k.claim("episode-lifecycle", "pod-a", 300) is not None
    clock.advance(seconds=300)  # renewTime + duration == now: expired
    lease = await k.claim("episode-lifecycle", "pod-b", 300)
    assert lease is not None and lease.holder == "pod-b" and lease.fence == 1
    spec = kube.spec("episode-lifecycle")
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("pod-b", 1)
    assert spec["acquireTime"] == format_microtime(clock.now())
    clock.advance(seconds=301)
    assert (await k.claim("episode-lifecycle", "pod-a", 300)).fence == 2  # type: ignore[union-attr]


async def test_racing_takeovers_exactly_one_wins_on_the_resource_version(
    kube: ScriptedKubeAPI, clock: ManualClock
) -> None:
    k = claimer(kube, clock, timeout_seconds=60)  # one GET waits at the barrier for the other
    assert await k.claim("skill-curator", "pod-old", 60) is not None
    clock.advance(seconds=61)
    kube.get_barrier = threading.Barrier(2)  # both read the same resourceVersion before either writes
    results = await asyncio.gather(k.claim("skill-curator", "pod-a", 60), k.claim("skill-curator", "pod-b", 60))
    kube.get_barrier = None
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert kube.spec("skill-curator")["holderIdentity"] == winners[0].holder
    assert winners[0].fence == 1
    puts = [b for m, _, b in kube.requests if m == "PUT"]
    assert len(puts) == 2 and {p["metadata"]["resourceVersion"] for p in puts} == {"101"}  # type: ignore[index]


async def test_racing_creates_exactly_one_wins(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock, timeout_seconds=60)  # one GET waits at the barrier for the other
    kube.get_barrier = threading.Barrier(2)  # both see 404, both create
    results = await asyncio.gather(k.claim("diary-sweep", "pod-a", 60), k.claim("diary-sweep", "pod-b", 60))
    kube.get_barrier = None
    assert len([r for r in results if r is not None]) == 1
    assert [m for m, _, _ in kube.requests].count("POST") == 2


async def test_release_lets_another_claim_at_once(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock)
    lease = await k.claim("diary-fill", "pod-a", 300)
    assert lease is not None
    await k.release(lease)
    spec = kube.spec("diary-fill")
    assert "holderIdentity" not in spec
    assert parse_microtime(spec["renewTime"]) + timedelta(seconds=spec["leaseDurationSeconds"]) <= clock.now()
    other = await k.claim("diary-fill", "pod-b", 300)  # no clock movement
    assert other is not None and other.fence == 1


async def test_release_leaves_a_lease_taken_over_since(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock)
    stale = await k.claim("diary-fill", "pod-a", 60)
    assert stale is not None
    clock.advance(seconds=61)
    assert await k.claim("diary-fill", "pod-b", 60) is not None
    await k.release(stale)
    assert kube.spec("diary-fill")["holderIdentity"] == "pod-b"


async def test_release_never_raises(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock)
    lease = await k.claim("diary-fill", "pod-a", 300)
    assert lease is not None
    kube.faults.append(Fault(500))
    await k.release(lease)
    kube.stop()
    await k.release(lease)


async def test_an_unreachable_server_refuses(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    url = kube.url
    kube.stop()
    assert await KubernetesLeaseClaimer(url, NS, clock).claim("diary-fill", "pod-a", 300) is None


@pytest.mark.parametrize(
    "fault",
    [
        Fault(500),
        Fault(503),
        Fault(403),
        Fault(200, raw=b"<html>not json"),
        Fault(200, raw=b'{"kind": "Lease", "spec": {"renewTime": "yesterday"}}'),
        Fault(200, raw=b"[1, 2, 3]"),
    ],
    ids=["500", "503", "403", "garbage", "bad-time", "not-an-object"],
)
async def test_a_read_that_cannot_be_trusted_refuses(kube: ScriptedKubeAPI, clock: ManualClock, fault: Fault) -> None:
    kube.faults.append(fault)
    assert await claimer(kube, clock).claim("diary-fill", "pod-a", 300) is None
    assert "diary-fill" not in kube.leases


async def test_a_failed_write_refuses(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    k = claimer(kube, clock)
    assert await k.claim("diary-fill", "pod-a", 60) is not None
    clock.advance(seconds=61)
    kube.faults.append(Fault(500, method="PUT"))
    assert await k.claim("diary-fill", "pod-b", 60) is None  # the replace's answer was a 500
    kube.faults.append(Fault(201, raw=b"created?", method="POST"))
    assert await k.claim("episode-fill", "pod-b", 60) is None  # a create whose answer is unreadable


async def test_a_slow_server_times_out_and_refuses(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    kube.faults.append(Fault(200, delay=1.5))
    started = time.monotonic()
    assert await claimer(kube, clock, timeout_seconds=0.3).claim("diary-fill", "pod-a", 300) is None
    assert time.monotonic() - started < 1.4


async def test_run_pass_does_not_run_when_the_claim_fails(kube: ScriptedKubeAPI, clock: ManualClock) -> None:
    calls: list[str] = []

    async def work() -> str:
        calls.append("ran")
        return "done"

    spec = PassSpec("diary-sweep", work, 3600)
    k = claimer(kube, clock)
    kube.faults.append(Fault(500))
    assert await run_pass(spec, k, "pod-a", 300) == (False, None)
    assert await k.claim("diary-sweep", "pod-b", 300) is not None
    assert await run_pass(spec, k, "pod-a", 300) == (False, None)  # held by pod-b
    assert calls == []
    clock.advance(seconds=301)
    assert await run_pass(spec, k, "pod-a", 300) == (True, "done")
    assert calls == ["ran"]
    assert "holderIdentity" not in kube.spec("diary-sweep")  # released at the end


def test_microtime_round_trip_and_api_forms() -> None:
    clock = ManualClock()
    when = clock.advance(seconds=1.25)
    assert format_microtime(when) == "2026-01-01T00:00:01.250000Z"
    assert parse_microtime(format_microtime(when)) == when
    assert parse_microtime("2026-01-01T00:00:01Z") == when - timedelta(seconds=0.25)
    assert parse_microtime("2026-01-01T00:00:01.250000123Z") == when  # nanoseconds are cut
    with pytest.raises(ValueError):
        parse_microtime("2026-01-01T00:00:01")


def test_from_settings_in_cluster_defaults(tmp_path: Path, clock: ManualClock) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "namespace").write_text("team-x\n")
    (sa / "token").write_text("tok")
    k = KubernetesLeaseClaimer.from_settings(LeaseConfig(backend="kubernetes"), clock, serviceaccount_dir=sa)
    assert k.namespace == "team-x"
    assert k._api == IN_CLUSTER_API
    named = LeaseConfig(backend="kubernetes", kubernetes_namespace="ops", kubernetes_api="http://127.0.0.1:1/")
    k = KubernetesLeaseClaimer.from_settings(named, clock, serviceaccount_dir=sa)
    assert (k.namespace, k._api) == ("ops", "http://127.0.0.1:1")
    k = KubernetesLeaseClaimer.from_settings(LeaseConfig(), clock, serviceaccount_dir=tmp_path / "absent")
    assert k.namespace == "agentlearn"


async def test_the_token_is_never_sent_over_plain_http(
    kube: ScriptedKubeAPI, clock: ManualClock, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token")
    seen: list[str | None] = []
    k = claimer(kube, clock, token_path=token)
    client = k._client()
    seen.append(client.headers.get("authorization"))
    await client.aclose()
    assert seen == [None]
    https = KubernetesLeaseClaimer("https://example.invalid", NS, clock, token_path=token)
    client = https._client()
    assert client.headers.get("authorization") == "Bearer secret-token"
    await client.aclose()


class _NoIndex:
    name = "none"

    async def close(self) -> None:
        pass


async def test_config_selects_the_kubernetes_backend(
    kube: ScriptedKubeAPI, clock: ManualClock, dsn: str, make_settings
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(leases={"backend": "kubernetes", "kubernetes_api": kube.url, "kubernetes_namespace": NS})
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(settings, stack, [], clock=clock, embedder=None, dsn=dsn, index=_NoIndex())
        assert isinstance(infra.leases, KubernetesLeaseClaimer)
        ran, _ = await run_pass(PassSpec("diary-fill", lambda: asyncio.sleep(0, "ok"), 60), infra.leases, "pod-a", 60)
    assert ran
    assert kube.spec("diary-fill")["leaseTransitions"] == 0
