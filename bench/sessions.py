"""Session learning checks: throughput and queue lag (issue 11), with the offline model provider.

    ./run bench sessions [--checks 120] [--workers 1,2,4] [--rates 2,5] [--seconds 15]

The diary, skills, knowledge, prefetch and sessions run in this process on one
loopback gRPC server, as in the all-in-one (embedded PostgreSQL, embedded Qdrant, the local MiniLM
model). Each check reads a session's evidence (a user message the user asked to remember, six tool
results, a green verification, a plan), makes the one review call (offline rule), and writes a
project lesson (a knowledge page, embedded inline), a personal fact (through the memory judge and
the embedding dedup into the diary) and a skill proposal (the first is filed; the rest are
duplicates of it by tool set). Two measurements:

1. throughput: N checks are queued (one manual check per session), then drained by W workers at
   once (``sessions.concurrency``): checks per second;
2. queue lag at a fixed rate: sessions queue a check at R per second while the worker loop (woken
   by LISTEN/NOTIFY, polling every 15 s as the backstop) runs; lag = finish - queue time, from the
   receipts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as pb_grpc
from bench.harness import open_app
from bench.harness import quantile as pct
from libs.common.clock import SystemClock
from libs.common.protoconv import timestamp

NAMES = ["diary", "skills", "knowledge", "prefetch", "sessions"]
TOOLS = ["make", "grep", "git", "gh", "bash", "pytest"]


async def _app(root: Path, concurrency: int, stack: contextlib.AsyncExitStack):  # type: ignore[no-untyped-def]
    overrides = {
        "server": {"http_port": 0},
        "sessions": {"concurrency": concurrency},
        "companies": {"bench": {"roles": {"swe": {"workspaces": ["payments"]}}}},
    }
    infra, components, channel, _ = await open_app(root, NAMES, overrides, stack)
    return infra, components, channel


def _events(i: int, now) -> list[pb.SessionEvent]:  # type: ignore[no-untyped-def]
    def ev(n: int, kind: int, text: str, **kw) -> pb.SessionEvent:  # type: ignore[no-untyped-def]
        return pb.SessionEvent(
            event_id=f"e{n}", kind=kind, text=text, event_time=timestamp(now + timedelta(seconds=n)), turn_id="t1", **kw
        )

    ok = pb.EVENT_STATUS_SUCCEEDED
    events = [
        ev(0, pb.EVENT_KIND_USER_MESSAGE, f"Owner {i} reviews pull requests only on day {i % 7}.", remember=True),
        ev(1, pb.EVENT_KIND_ASSISTANT_MESSAGE, "On it."),
    ]
    for n, tool in enumerate(TOOLS, 2):
        events.append(ev(n, pb.EVENT_KIND_TOOL_REQUEST, f"{tool} --run {i}", tool_name=tool))
        events.append(
            ev(n + 10, pb.EVENT_KIND_TOOL_RESULT, f"{tool} finished step {n} of job {i}", tool_name=tool, status=ok)
        )
    events.append(ev(30, pb.EVENT_KIND_VERIFICATION, f"suite {i}: 42 passed", tool_name="pytest", status=ok))
    return events


async def _session(stub: pb_grpc.SessionServiceStub, i: int, tag: str) -> str:
    session = f"{tag}-{i:05d}"
    await stub.AppendSessionEvents(
        pb.AppendSessionEventsRequest(
            company="bench",
            session_id=session,
            user=f"user{i % 17}",
            seat=f"seat{i % 11}",
            role="swe",
            workspace="payments",
            events=_events(i, SystemClock().now()),
        )
    )
    return session


async def throughput(checks: int, workers: list[int]) -> list[tuple[int, float, float]]:
    rows = []
    for w in workers:
        with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
            async with contextlib.AsyncExitStack() as stack:
                infra, components, channel = await _app(Path(tmp), w, stack)
                stub = pb_grpc.SessionServiceStub(channel)
                worker = components["sessions"].service.worker
                for i in range(checks):
                    session = await _session(stub, i, f"tp{w}")
                    await stub.CheckRecentWork(
                        pb.CheckRecentWorkRequest(company="bench", session_id=session, user=f"user{i % 17}")
                    )
                started = time.perf_counter()
                await asyncio.gather(*(worker.drain() for _ in range(w)))
                elapsed = time.perf_counter() - started
                outcomes = await infra.pool.fetch("SELECT outcome, count(*) FROM learning_checks GROUP BY outcome")
                assert dict(outcomes) == {"completed": checks}, dict(outcomes)
                per = await infra.pool.fetchval(
                    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finish_time - start_time))"
                    " FROM learning_checks"
                )
                rows.append((w, checks / elapsed, float(per) * 1000))
    return rows


async def lag(rates: list[int], seconds: float) -> list[tuple[int, int, float, float, float]]:
    rows = []
    for rate in rates:
        with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
            async with contextlib.AsyncExitStack() as stack:
                infra, components, channel = await _app(Path(tmp), 2, stack)
                stub = pb_grpc.SessionServiceStub(channel)
                loop = asyncio.create_task(components["sessions"].background[0]())
                total = int(rate * seconds)
                for i in range(total):
                    await _session(stub, i, f"lag{rate}")  # recorded ahead: the lag is the queue's
                start = time.perf_counter()
                for i in range(total):
                    due = start + i / rate
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    await stub.CheckRecentWork(
                        pb.CheckRecentWorkRequest(
                            company="bench", session_id=f"lag{rate}-{i:05d}", user=f"user{i % 17}"
                        )
                    )
                async with asyncio.timeout(600):
                    while await infra.pool.fetchval("SELECT count(*) FROM learning_checks WHERE finish_time IS NULL"):
                        await asyncio.sleep(0.2)
                loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
                lags = [
                    float(r[0])
                    for r in await infra.pool.fetch(
                        "SELECT extract(epoch FROM finish_time - create_time) FROM learning_checks"
                    )
                ]
                rows.append((rate, total, statistics.median(lags), pct(lags, 0.99), max(lags)))
    return rows


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checks", type=int, default=120)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--rates", default="2,5")
    p.add_argument("--seconds", type=float, default=15.0)
    args = p.parse_args()
    workers = [int(x) for x in args.workers.split(",")]
    rates = [int(x) for x in args.rates.split(",")]
    print(f"Session learning checks, offline provider, local MiniLM; {args.checks} checks per run\n")
    print("| workers | checks/s | one check p50 ms |")
    print("|---|---|---|")
    for w, rate, p50 in await throughput(args.checks, workers):
        print(f"| {w} | {rate:.1f} | {p50:.0f} |")
    print(f"\nQueue lag at a fixed rate ({args.seconds:.0f} s of checks, 2 workers, LISTEN/NOTIFY wake):\n")
    print("| checks/s offered | checks | lag p50 s | lag p99 s | lag max s |")
    print("|---|---|---|---|---|")
    for rate, total, p50, p99, top in await lag(rates, args.seconds):
        print(f"| {rate} | {total} | {p50:.2f} | {p99:.2f} | {top:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
