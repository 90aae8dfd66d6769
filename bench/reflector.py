"""Reflector throughput and queue lag (issue 5), with the offline model provider.

    ./run bench reflector [--turns 400] [--rates 2,5,10] [--seconds 20] [--concurrency 1,4,16]
                          [--lag-concurrency 16]

Every service runs in this process on one loopback gRPC server, exactly as the all-in-one does
(embedded PostgreSQL, embedded Qdrant, the local MiniLM model): the reflector's workers call the
diary, episodes, profiles and skills over gRPC. Two measurements:

1. throughput: N turns are queued, then the harness drains them (``learning.reflection.concurrency``
   turns at once): turns reflected per second, per concurrency; with two load-independent figures
   per turn: PostgreSQL commits (``pg_stat_database.xact_commit``: a statement outside a
   transaction is one) and this process's CPU time (every service's Python, gRPC and ONNX threads;
   not PostgreSQL's);
2. queue lag at a fixed submit rate: turns are submitted at R per second through SubmitTurn, by a
   separate process (as an engine would: a submitter sharing the reflector's event loop slows down
   with it and never offers the rate), while the background worker loop (woken by LISTEN/NOTIFY)
   runs; lag = completion time - the time the submitter sent the turn. The rate the submitter
   actually achieved is printed beside it.

Every turn runs every worker: a message with a stated preference (a LONG note), a sender to profile,
five tool calls (a synthesis candidate) and an offered skill (skill use, refiner).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from libs.common.clock import SystemClock
from libs.common.config import load_settings
from libs.common.embedded_pg import start_embedded_postgres
from libs.common.grpcserver import create_server
from libs.common.infra import open_infra
from services.runner.registry import SERVICES, migrations_of
from tests.support.turns import message, turn

NAMES = ["diary", "episodes", "skills", "profiles", "reflector"]
WORKER_P50: dict[int, dict[str, float]] = {}
LAG_COSTS: dict[float, tuple[float, float, float, float]] = {}
"""Per lag run: the submit rate achieved, turns reflected per second over the run, commits and CPU ms
per turn (SubmitTurn's share included)."""
PORTS: list[int] = []
"""The port of the last server ``_app`` started (the submitter process calls it)."""
TOOLS = ["jira_get_issue", "github_search", "github_create_branch", "run_tests", "github_create_pr"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _app(root: Path, concurrency: int, stack: contextlib.AsyncExitStack):  # type: ignore[no-untyped-def]
    settings = load_settings(
        None,
        {
            "data_dir": str(root / "data"),
            "learning": {"reflection": {"concurrency": concurrency, "poll_interval_seconds": 1.0}},
        },
        env={},
    )
    dsn = await start_embedded_postgres(root / "pg")
    infra = await open_infra(settings, stack, migrations_of(NAMES), clock=SystemClock(), dsn=dsn)
    await asyncio.to_thread(infra.embedder.load)
    components = {n: SERVICES[n].component(infra) for n in NAMES}
    server, port, _ = await create_server([r for c in components.values() for r in c.registrations], "127.0.0.1:0")
    stack.push_async_callback(server.stop, None)
    infra.channels.serve_locally(NAMES, f"127.0.0.1:{port}")
    PORTS.append(port)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stack.push_async_callback(channel.close)
    return infra, components, channel


def _turn(i: int, seat: str, skill: tuple[str, str], now) -> pb.TurnCompleted:  # type: ignore[no-untyped-def]
    msgs = [message(f"person{i % 13}", f"Thanks. I prefer summary format {i} for the release notes.")]
    return turn(
        f"bench-{seat}-{i:05d}",
        now=now,
        seat=seat,
        messages=msgs,
        tools=TOOLS,
        offered=[skill],
        ask=f"Prepare release notes for version {i}",
    )


async def _seed_skill(channel: grpc.aio.Channel, seat: str) -> tuple[str, str]:
    resp = await sk_grpc.SkillServiceStub(channel).CreateSkill(
        sk_pb.CreateSkillRequest(
            company="acme",
            seat=seat,
            name="release-notes",
            summary="write release notes",
            body="# Release notes\n\n1. Collect merged PRs.\n",
            tool_sequence=["github_search", "docs_write"],
            trigger=sk_pb.SKILL_TRIGGER_SINGLE,
            source_turn_ids=["seed"],
        )
    )
    return resp.skill.id, resp.skill.name


async def _commits(pool) -> int:  # type: ignore[no-untyped-def]
    """Transactions committed in the database so far (the statistics collector's count)."""
    await pool.execute("SELECT pg_stat_clear_snapshot()")
    return int(await pool.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))


async def throughput(turns: int, concurrency: int) -> tuple[float, float, float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-reflector-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            infra, components, channel = await _app(Path(tmp), concurrency, stack)
            stub = pb_grpc.ReflectorServiceStub(channel)
            seats = [f"seat-{s}" for s in range(20)]
            skills = {s: await _seed_skill(channel, s) for s in seats}
            t0 = time.perf_counter()
            for i in range(turns):
                seat = seats[i % len(seats)]
                await stub.SubmitTurn(pb.SubmitTurnRequest(turn=_turn(i, seat, skills[seat], infra.clock.now())))
            submit_s = time.perf_counter() - t0
            harness = components["reflector"].service.harness
            commits0 = await _commits(infra.pool)
            cpu0, t0 = time.process_time(), time.perf_counter()
            async with asyncio.TaskGroup() as group:
                # One drain() runs ``concurrency`` turns at once (issue 14); an older harness (an A/B
                # run against the previous tree) ran one turn per drain().
                for _ in range(1 if hasattr(harness, "_dispatch") else concurrency):
                    group.create_task(harness.drain())
            drain_s = time.perf_counter() - t0
            cpu_s = time.process_time() - cpu0
            await asyncio.sleep(1.5)  # backends report their counts to the statistics at most once a second
            commits = await _commits(infra.pool) - commits0
            done = await infra.pool.fetchval("SELECT count(*) FROM reflections WHERE state = 'completed'")
            assert done == turns, f"{done} of {turns} reflected"
            rows = await infra.pool.fetch(
                """SELECT w->>'worker' AS worker, percentile_cont(0.5) WITHIN GROUP (ORDER BY (w->>'duration_ms')::int)
                       AS p50
                   FROM reflections, jsonb_array_elements(workers) w GROUP BY 1"""
            )
            WORKER_P50[concurrency] = {r["worker"]: float(r["p50"]) for r in rows}
            return turns / submit_s, turns / drain_s, commits / turns, cpu_s * 1000 / turns


async def submitter(port: int, rate: float, n: int, skills: dict[str, list[str]]) -> None:
    """The submitting process: ``n`` turns at ``rate`` per second over its own channel; prints, as
    JSON, when each was sent (wall clock) and the rate achieved."""
    seats = sorted(skills)
    sent: dict[str, float] = {}
    clock = SystemClock()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ReflectorServiceStub(channel)

        async def one(i: int) -> None:
            seat = seats[i % len(seats)]
            t = _turn(i, seat, tuple(skills[seat]), clock.now())  # type: ignore[arg-type]
            sent[f"{seat}/{t.turn_id}"] = time.time()
            await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t), timeout=60)

        start = time.perf_counter()
        calls = []
        for i in range(n):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            calls.append(asyncio.create_task(one(i)))  # not awaited in turn: a slow answer delays no send
        sending = time.perf_counter() - start
        await asyncio.gather(*calls)
    print(json.dumps({"sent": sent, "rate": n / sending if sending else float(n)}))


async def lag(rate: float, seconds: float, concurrency: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="bench-reflector-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            infra, components, channel = await _app(Path(tmp), concurrency, stack)
            seats = [f"seat-{s}" for s in range(20)]
            skills = {s: list(await _seed_skill(channel, s)) for s in seats}
            commits0 = await _commits(infra.pool)
            cpu0 = time.process_time()
            worker = asyncio.create_task(components["reflector"].background[0]())
            n = int(rate * seconds)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--submit-to", str(PORTS[-1]), "--rates", str(rate), "--turns", str(n),
                "--skills", json.dumps(skills), stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            assert proc.returncode == 0, "the submitter failed"
            submitted = json.loads(out.decode().strip().splitlines()[-1])
            async with asyncio.timeout(seconds * 20 + 120):
                while await infra.pool.fetchval("SELECT count(*) FROM reflections WHERE state <> 'completed'"):
                    await asyncio.sleep(0.2)
            cpu_s = time.process_time() - cpu0  # SubmitTurn's share included (it is served here)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await asyncio.sleep(1.5)  # backends report their counts to the statistics at most once a second
            commits = await _commits(infra.pool) - commits0
            rows = await infra.pool.fetch("SELECT seat, turn_id, complete_time FROM reflections")
            assert len(rows) == n, f"{len(rows)} of {n} turns recorded"
            sent = {k: datetime.fromtimestamp(v, UTC) for k, v in submitted["sent"].items()}
            lags = [(r["complete_time"] - sent[f"{r['seat']}/{r['turn_id']}"]).total_seconds() for r in rows]
            span = (max(r["complete_time"] for r in rows) - min(sent.values())).total_seconds()
            LAG_COSTS[rate] = (submitted["rate"], n / span, commits / n, cpu_s * 1000 / n)
            return lags


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--rates", default="2,5,10")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", default="1,4,16", help="turns reflected at once, one run each")
    parser.add_argument("--lag-concurrency", type=int, default=16, help="turns reflected at once in the lag runs")
    parser.add_argument("--submit-to", type=int, default=0, help=argparse.SUPPRESS)  # the submitter process
    parser.add_argument("--skills", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.submit_to:
        await submitter(args.submit_to, float(args.rates), args.turns, json.loads(args.skills))
        return

    print(f"reflector throughput: {args.turns} turns queued, then drained (offline provider, every worker runs)")
    print(
        f"{'turns at once':>13} {'submit turns/s':>15} {'reflect turns/s':>16} {'vs first':>9} "
        f"{'commits/turn':>13} {'CPU ms/turn':>12}"
    )
    base = None
    for c in [int(x) for x in args.concurrency.split(",")]:
        submit, reflect, commits, cpu_ms = await throughput(args.turns, c)
        base = base or reflect
        print(f"{c:>13} {submit:>15.1f} {reflect:>16.1f} {reflect / base:>8.2f}x {commits:>13.1f} {cpu_ms:>12.1f}")

    order = ["persist_decider", "episodist", "profiler", "skill_use", "synthesizer", "refiner"]
    print("\nper-worker p50 ms (" + ", ".join(f"{c} at once" for c in WORKER_P50) + ")")
    for name in order:
        print(f"{name:>16} " + " ".join(f"{WORKER_P50[c].get(name, 0):>9.1f}" for c in WORKER_P50))

    print(
        f"\nqueue lag at a fixed submit rate ({args.seconds:.0f} s of submits, {args.lag_concurrency} turns at once, "
        "LISTEN/NOTIFY wake-ups)"
    )
    print(
        f"{'rate/s':>7} {'sent/s':>7} {'turns':>6} {'lag p50 ms':>11} {'lag p99 ms':>11} {'max ms':>9} "
        f"{'done/s':>7} {'commits/turn':>13} {'CPU ms/turn':>12}"
    )
    for rate in [float(x) for x in args.rates.split(",")]:
        lags = await lag(rate, args.seconds, args.lag_concurrency)
        sent_rate, done_rate, commits, cpu_ms = LAG_COSTS[rate]
        print(
            f"{rate:>7.1f} {sent_rate:>7.1f} {len(lags):>6} {statistics.median(lags) * 1000:>11.0f} "
            f"{pct(lags, 0.99) * 1000:>11.0f} {max(lags) * 1000:>9.0f} {done_rate:>7.1f} {commits:>13.1f} "
            f"{cpu_ms:>12.1f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
