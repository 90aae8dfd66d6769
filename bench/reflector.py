"""Reflector throughput and queue lag (issue 5), with the offline model provider.

    ./run bench reflector [--turns 400] [--rates 2,5,10] [--seconds 20] [--concurrency 1,4,16]
                          [--lag-concurrency 16] [--census 40]

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
   actually achieved is printed beside it. Under the table, per rate: the lag p99 of the turns sent a
   second or more after the first (a fresh app's first turns queue behind its warm-up, which is the
   whole p99 at a low rate) and the five slowest turns with when they were sent.

``--census N`` first reflects N turns with every SQL statement a span (``telemetry.sql_spans:
all``, an in-memory span recorder) and prints what one turn does, by owner (the service whose RPC
ran the statement, or the reflector's harness): statements, commits (a COMMIT, or a statement
outside a transaction), internal hops, and the embedder's model runs by size. The throughput and
lag runs print the embedder's model runs by size too (do concurrent turns' texts meet in one run?).

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
from bench.harness import open_app
from bench.harness import quantile as pct
from libs.common.clock import SystemClock
from libs.common.config import load_settings
from tests.support.turns import message, turn

NAMES = ["diary", "episodes", "skills", "profiles", "reflector"]
WORKER_P50: dict[int, dict[str, float]] = {}
RUN_SIZES: dict[str, tuple[dict[int, int], dict[int, int]]] = {}
DETAIL: dict[str, dict[str, float]] = {}
"""The census: per owner, its statements by name, per turn."""
"""Per run: the embedder's model runs by texts a run, and its jobs by callers a job."""
LAG_COSTS: dict[float, tuple[float, float, float, float]] = {}
"""Per lag run: the submit rate achieved, turns reflected per second over the run, commits and CPU ms
per turn (SubmitTurn's share included)."""
LAG_WORST: dict[float, tuple[list[tuple[float, float, str]], float]] = {}
"""Per lag run: its slowest turns (lag s, seconds after the first send, turn id) and the lag p99 of the
turns sent a second or more after the first (a fresh app's first turns queue behind its warm-up)."""
TIMELINE: dict[float, list[tuple[float, float, str]]] = {}
"""Per lag run: every turn's send and completion (Unix seconds) and its id, for ``--lag-timeline``."""
PORTS: list[int] = []
"""The port of the last server ``_app`` started (the submitter process calls it)."""
TOOLS = ["jira_get_issue", "github_search", "github_create_branch", "run_tests", "github_create_pr"]


SEATS = [f"seat-{s}" for s in range(20)]
"""The seats every run submits turns for, each offered one seeded skill."""


async def _app(root: Path, concurrency: int, stack: contextlib.AsyncExitStack):  # type: ignore[no-untyped-def]
    """The all-in-one under ``root`` with one skill seeded per seat of SEATS: infra, components,
    channel, and each seat's (skill id, name)."""
    overrides = {"learning": {"reflection": {"concurrency": concurrency, "poll_interval_seconds": 1.0}}}
    infra, components, channel, port = await open_app(root, NAMES, overrides, stack)
    PORTS.append(port)
    skills = {s: await _seed_skill(channel, s) for s in SEATS}
    return infra, components, channel, skills


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
            infra, components, channel, skills = await _app(Path(tmp), concurrency, stack)
            stub = pb_grpc.ReflectorServiceStub(channel)
            seats = SEATS
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
            _sizes(f"throughput, {concurrency} at once", infra.embedder)
            return turns / submit_s, turns / drain_s, commits / turns, cpu_s * 1000 / turns


def _sizes(label: str, embedder) -> None:  # type: ignore[no-untyped-def]
    RUN_SIZES[label] = (dict(getattr(embedder, "run_sizes", {})), dict(getattr(embedder, "job_callers", {})))


def _owner(span, by_id) -> str:  # type: ignore[no-untyped-def]
    """The service method whose handler ran ``span`` (the nearest RPC ancestor), else the harness."""
    while span is not None:
        if span.name == "reflect":  # a pass runs in the trace of the SubmitTurn that queued it
            return "reflector harness"
        name = span.name.lstrip("/")
        if name.startswith("agentlearn.") and "Service/" in name:
            service, method = name.rsplit("/", 1)
            return f"{service.split('.')[1]} {method}"
        parent = span.parent.span_id if span.parent is not None else None
        span = by_id.get(parent)
    return "reflector harness"


def _tx_kind(span) -> str:  # type: ignore[no-untyped-def]
    text = str(span.attributes.get("db.query.text", "")).lstrip().upper()
    for kind in ("BEGIN", "COMMIT", "ROLLBACK"):
        if text.startswith(kind) and not text.startswith("ROLLBACK TO"):
            return kind
    if text.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK TO")):
        return "SAVEPOINT"
    return "statement"


def census_of(spans, turns: int) -> list[tuple[str, float, float, float, float]]:  # type: ignore[no-untyped-def]
    """Per owner and per turn: statements, BEGINs, commits, hops (calls of that method). A commit is
    a COMMIT or a statement outside a transaction (the owner's statements in time order, nesting by
    BEGIN/COMMIT: one handler's statements do not interleave with its own transaction's)."""
    by_id = {s.context.span_id: s for s in spans}
    stmts: dict[str, list] = {}  # type: ignore[type-arg]
    hops: dict[str, int] = {}
    for s in spans:
        name = s.name.lstrip("/")
        if name.startswith("agentlearn.") and "Service/" in name:
            key = _owner(s, by_id)
            hops[key] = hops.get(key, 0) + 1
        if s.name.startswith("db "):
            stmts.setdefault(_owner(s, by_id), []).append(s)
    out = []
    for owner, ss in stmts.items():
        names: dict[str, int] = {}
        for sp in ss:
            kind = _tx_kind(sp)
            key = sp.name[3:] if kind == "statement" else kind
            names[key] = names.get(key, 0) + 1
        DETAIL[owner] = {k: v / turns for k, v in sorted(names.items(), key=lambda kv: -kv[1])}
    for owner in sorted(set(stmts) | set(hops)):
        ordered = sorted(stmts.get(owner, []), key=lambda s: s.start_time)
        kinds = [_tx_kind(s) for s in ordered]
        begins = kinds.count("BEGIN")
        commits = kinds.count("COMMIT")
        # Statements outside any BEGIN..COMMIT of the same parent (an RPC's or the harness's).
        open_tx: dict[object, int] = {}
        auto = 0
        for s, kind in zip(ordered, kinds, strict=True):
            parent = s.parent.span_id if s.parent is not None else None
            if kind == "BEGIN":
                open_tx[parent] = open_tx.get(parent, 0) + 1
            elif kind in ("COMMIT", "ROLLBACK"):
                open_tx[parent] = max(0, open_tx.get(parent, 0) - 1)
            elif not open_tx.get(parent) and kind != "SAVEPOINT":
                auto += 1
        out.append((owner, len(ordered) / turns, begins / turns, (commits + auto) / turns, hops.get(owner, 0) / turns))
    return out


async def census(turns: int, concurrency: int) -> None:
    """Reflect ``turns`` turns with every statement a span; print what one turn does, by owner."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libs.common import telemetry
    from libs.common.db import configure_sql_spans

    exporter = InMemorySpanExporter()
    settings = load_settings(None, {"telemetry": {"sql_spans": "all"}}, env={})
    telemetry.configure_tracing(settings.telemetry, extra_processors=[SimpleSpanProcessor(exporter)])
    configure_sql_spans("all")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-reflector-") as tmp:
            async with contextlib.AsyncExitStack() as stack:
                infra, components, channel, skills = await _app(Path(tmp), concurrency, stack)
                stub = pb_grpc.ReflectorServiceStub(channel)
                seats = SEATS
                exporter.clear()
                commits0 = await _commits(infra.pool)
                for i in range(turns):
                    seat = seats[i % len(seats)]
                    await stub.SubmitTurn(pb.SubmitTurnRequest(turn=_turn(i, seat, skills[seat], infra.clock.now())))
                harness = components["reflector"].service.harness
                runs0 = dict(infra.embedder.run_sizes) if hasattr(infra.embedder, "run_sizes") else {}
                async with asyncio.TaskGroup() as group:
                    for _ in range(1 if hasattr(harness, "_dispatch") else concurrency):
                        group.create_task(harness.drain())
                await asyncio.sleep(1.5)
                commits = await _commits(infra.pool) - commits0
                spans = exporter.get_finished_spans()
                rows = census_of(spans, turns)
                runs = {k: v - runs0.get(k, 0) for k, v in getattr(infra.embedder, "run_sizes", {}).items()}
    finally:
        configure_sql_spans("slow")
    print(f"census: {turns} turns submitted and reflected ({concurrency} at once), every SQL statement a span")
    print(f"{'owner (method)':>40} {'stmts/turn':>11} {'BEGIN/turn':>11} {'commits/turn':>13} {'calls/turn':>11}")
    for owner, n, b, c, h in sorted(rows, key=lambda r: -r[3]):
        print(f"{owner:>40} {n:>11.2f} {b:>11.2f} {c:>13.2f} {h:>11.2f}")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'all (traced)':>40} {total[0]:>11.2f} {total[1]:>11.2f} {total[2]:>13.2f}")
    label = "PostgreSQL xact_commit / turn"
    print(f"{label:>40} {'':>11} {'':>11} {commits / turns:>13.2f}  (all: claims, renewals, untraced too)")
    print(f"spans / turn {len(spans) / turns:.1f}; model runs by texts a run: {dict(sorted(runs.items()))}")
    print("statements per turn, by owner:")
    for owner, names in sorted(DETAIL.items()):
        print(f"  {owner}: " + ", ".join(f"{k} {v:.2f}" for k, v in names.items()))
    print()


async def submitter(port: int, rate: float, n: int, skills: dict[str, list[str]]) -> None:
    """The submitting process: ``n`` turns at ``rate`` per second over its own channel; prints, as
    JSON, when each was sent (wall clock) and the rate achieved."""
    seats = sorted(skills)
    sent: dict[str, float] = {}
    shed: list[int] = []
    clock = SystemClock()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ReflectorServiceStub(channel)

        async def one(i: int) -> None:
            seat = seats[i % len(seats)]
            t = _turn(i, seat, tuple(skills[seat]), clock.now())  # type: ignore[arg-type]
            sent[f"{seat}/{t.turn_id}"] = time.time()
            for attempt in range(50):
                try:
                    await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t), timeout=60)
                    return
                except grpc.aio.AioRpcError as err:
                    # Shed (too many calls in flight on a loaded machine): retry as an engine would;
                    # the lag still counts from the first send.
                    if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == 49:
                        raise
                    shed.append(1)
                    await asyncio.sleep(0.1 * (attempt + 1))

        start = time.perf_counter()
        calls = []
        for i in range(n):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            calls.append(asyncio.create_task(one(i)))  # not awaited in turn: a slow answer delays no send
        sending = time.perf_counter() - start
        await asyncio.gather(*calls)
    print(json.dumps({"sent": sent, "rate": n / sending if sending else float(n), "shed": len(shed)}))


async def lag(rate: float, seconds: float, concurrency: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="bench-reflector-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            infra, components, _, seeded = await _app(Path(tmp), concurrency, stack)
            skills = {s: list(skill) for s, skill in seeded.items()}
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
            if submitted.get("shed"):
                print(f"(the submitter was shed {submitted['shed']} times and retried; lag counts from the first send)")
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
            first = min(sent.values())
            timed = sorted(
                ((r["complete_time"] - sent[k]).total_seconds(), (sent[k] - first).total_seconds(), r["turn_id"])
                for r in rows
                for k in [f"{r['seat']}/{r['turn_id']}"]
            )
            LAG_WORST[rate] = (timed[-5:][::-1], pct([lag for lag, after, _ in timed if after >= 1.0], 0.99))
            TIMELINE[rate] = sorted(
                (submitted["sent"][k], r["complete_time"].timestamp(), r["turn_id"])
                for r in rows
                for k in [f"{r['seat']}/{r['turn_id']}"]
            )
            _sizes(f"lag, {rate:g}/s", infra.embedder)
            return lags


def _write_timeline(path: Path) -> None:
    """``--lag-timeline``: every lag run's turns, one JSON object a line."""
    path.write_text(
        "".join(
            json.dumps({"rate": rate, "sent": sent_s, "done": done_s, "turn": turn_id}) + "\n"
            for rate, turns in TIMELINE.items()
            for sent_s, done_s, turn_id in turns
        )
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--rates", default="2,5,10")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", default="1,4,16", help="turns reflected at once, one run each")
    parser.add_argument("--lag-concurrency", type=int, default=16, help="turns reflected at once in the lag runs")
    parser.add_argument("--census", type=int, default=0, help="first, what N turns do, by owner (every SQL a span)")
    parser.add_argument("--census-only", action="store_true", help="only the census")
    parser.add_argument(
        "--lag-timeline",
        default="",
        help="write every lag run's turns (rate, sent and completed as Unix seconds, turn id) to this JSON-lines "
        "file, to line a stall up with system counters sampled meanwhile",
    )
    parser.add_argument(
        "--experiment-no-pool-reset",
        action="store_true",
        help="an experiment, not the product: pooled connections go back without asyncpg's reset statement "
        "(SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL: one round trip and one commit a "
        "checkout; an open transaction is still rolled back)",
    )
    parser.add_argument("--submit-to", type=int, default=0, help=argparse.SUPPRESS)  # the submitter process
    parser.add_argument("--skills", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.submit_to:
        await submitter(args.submit_to, float(args.rates), args.turns, json.loads(args.skills))
        return

    if args.experiment_no_pool_reset:
        from libs.common.db import TracedConnection

        TracedConnection.get_reset_query = lambda self: ""  # the experiment: see --help
        print("EXPERIMENT: pooled connections are returned without the reset statement")
    if args.census:
        await census(args.census, 4)
        if args.census_only:
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
    for rate, (worst, p99_after) in LAG_WORST.items():
        print(
            f"  {rate:g}/s: lag p99 of the turns sent 1 s or more after the first {p99_after * 1000:.0f} ms; slowest "
            + ", ".join(f"{lag * 1000:.0f} ms (sent at {after:.1f} s)" for lag, after, _ in worst)
        )
    if args.lag_timeline:
        _write_timeline(Path(args.lag_timeline))
    print("\nembedder: model runs by texts a run; dispatched jobs by callers a job (texts of several turns)")
    for label, (sizes, callers) in RUN_SIZES.items():
        n = sum(sizes.values())
        texts = sum(k * v for k, v in sizes.items())
        print(
            f"  {label}: {n} runs, {texts / max(n, 1):.2f} texts a run, by size {dict(sorted(sizes.items()))}; "
            f"jobs by callers {dict(sorted(callers.items()))}"
        )


if __name__ == "__main__":
    asyncio.run(main())
