"""BuildTurnContext latency over gRPC with full memories, at 10 seats and at 1,000.

    ./run bench prefetch [--seats 1000] [--small 10] [--notes 500] [--episodes 500] [--skills 20]
                         [--queries 200] [--distinct 1500] [--sigma 0.15]

Everything is the real system in-process: an embedded PostgreSQL (temporary data directory, every
service's migrations), Qdrant's embedded engine (temporary directory), the local MiniLM embedder,
the OFFLINE auxiliary provider (the memory filter, the knowledge query and the episode briefing
answer from rules, so the model's own latency is not in these numbers), a ManualClock, and the
diary, episodes, skills, profiles and prefetch services served over gRPC on one loopback port, the
prefetch calling the others through their stubs exactly as in the all-in-one runner.

Loading. Each seat gets ``--notes`` diary notes, ``--episodes`` raw episodes, ``--skills`` skills and
one counterparty profile (of the sender the asks name), bulk-loaded straight into the owners'
tables with COPY, and the notes' and episodes' vectors into the index with ``upsert``, marked
indexed — writing them through the RPCs would embed each inline, which for a million rows is hours
of MiniLM on two cores. The vectors are REAL MiniLM vectors reused: ``--distinct`` distinct note
texts and as many turn texts are embedded once, and each row takes one of them plus Gaussian noise
(``--sigma`` of the norm, renormalised), so a seat's rows are near but not identical. The similarity
structure is therefore synthetic; the latency (index filter per seat, hydration, the lexical GIN
halves, the filter over a 100-note pool, the briefing, the skills menu and its stamp, the knowledge
search, the profile read, the onboarding marker, every gRPC hop and the summary event) is real.
The knowledge base holds 40 pages in the role's container (written through UpsertPage).

Timed. ``--queries`` BuildTurnContext calls on random seats, after a warm-up: a rich trigger (the
ask embedded once, every block), and a thin one (``requires_recon``: the gate). First with only
``--small`` seats loaded, then again after loading the rest (``--seats`` in all), so the ratio
shows what a thousand seats' data costs one seat's turn start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import random
import re
import sys
import time
import uuid
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

import numpy as np  # noqa: E402

from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb  # noqa: E402
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kn_grpc  # noqa: E402
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb  # noqa: E402
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc  # noqa: E402
from bench import harness  # noqa: E402
from bench.harness import loaded_minilm, noisy, open_edge_infra, pct, scratch_postgres, serve_loopback  # noqa: E402
from bench.harness.workplace import PEOPLE  # noqa: E402
from bench.harness.workplace import TOOLSETS as ALL_TOOLSETS  # noqa: E402
from bench.harness.workplace import TOPICS as ALL_TOPICS  # noqa: E402
from libs.common.clock import ManualClock  # noqa: E402
from libs.common.config import load_settings  # noqa: E402
from libs.common.vectorindex import collection_name  # noqa: E402
from services.diary.service import index_point as note_point  # noqa: E402
from services.episodes.domain import vector_text  # noqa: E402
from services.episodes.service import index_point as episode_point  # noqa: E402
from services.runner.registry import SERVICES, migrations_of  # noqa: E402

COMPANY, ROLE, MODEL = "bench", "swe", "all-MiniLM-L6-v2"
NAMES = ["diary", "episodes", "skills", "profiles", "knowledge", "prefetch"]
TOPICS = [ALL_TOPICS[i] for i in (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 14)]
FACTS = [
    "{p} prefers a short summary before any detail about {t}.",
    "{p} owns the decision on how we {t}.",
    "When asked to {t}, check the runbook first; {p} wrote it.",
    "Last time we had to {t}, {p} wanted a heads-up in the team channel.",
    "{p} is on leave next week, so someone else must {t}.",
]
ASKS = [
    "Bob asks: could you {t}? It is blocking the release.",
    "Please {t} before Friday, and tell Bob when it is done.",
    "Bob: can you {t}? The last attempt failed.",
]
TOOLSETS = [ALL_TOOLSETS[i] for i in (0, 1, 2, 3, 6, 7)]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def seat_name(i: int) -> str:
    return f"seat{i:04d}"


class Corpus:
    """Distinct note and turn texts, embedded once; rows reuse them with noise."""

    def __init__(self, n: int, rng: random.Random):
        self.notes = [FACTS[i % len(FACTS)].format(p=rng.choice(PEOPLE), t=TOPICS[i % len(TOPICS)]) for i in range(n)]
        self.turns = []
        for i in range(n):
            topic = TOPICS[i % len(TOPICS)]
            label = f"Message from {rng.choice(PEOPLE)}: Slack message"
            ask = ASKS[i % len(ASKS)].format(t=topic) + f" (ref #{i})"
            self.turns.append((label, ask, f"Done: {topic}; posted the result in the thread."))
        self.note_vecs: np.ndarray | None = None
        self.turn_vecs: np.ndarray | None = None

    async def embed(self, embedder) -> float:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = []
        texts = self.notes + [vector_text(*t) for t in self.turns]
        for i in range(0, len(texts), 256):
            out += await embedder.embed(texts[i : i + 256])
        vecs = np.stack([v.values for v in out]).astype(np.float32)
        self.note_vecs, self.turn_vecs = vecs[: len(self.notes)], vecs[len(self.notes) :]
        return time.perf_counter() - t0


NOTE_COLS = [
    "id", "company", "seat", "content", "tier", "source", "create_time", "use_count",
    "embedding", "embedding_model", "embedding_dims", "indexed",
]  # fmt: skip
EPISODE_COLS = [
    "id", "company", "seat", "role", "kind", "turn_id", "label", "ask", "what_it_did", "outcome",
    "tool_sequence", "tools_called", "start_time", "end_time", "duration_ms", "record_time",
    "embedding", "embedding_model", "embedding_dims", "indexed",
]  # fmt: skip
SKILL_COLS = [
    "id", "company", "seat", "name", "summary", "body", "tool_sequence", "trigger", "cluster_size",
    "source_turn_ids", "unused_since", "state_change_time", "create_time", "update_time", "version_time",
]  # fmt: skip
PROFILE_COLS = [
    "id", "company", "observer", "platform", "subject_key", "subject_handle", "communication_style",
    "topics", "observation_count", "create_time", "update_time",
]  # fmt: skip


async def load_seats(infra, clock, corpus: Corpus, seats: range, args, rng: np.random.Generator) -> float:  # type: ignore[no-untyped-def]
    """COPY each seat's notes, episodes, skills and profile; upsert the vectors into the index."""
    now = clock.now()
    dims = corpus.note_vecs.shape[1]  # type: ignore[union-attr]
    notes_coll, eps_coll = collection_name("diary_notes", dims), collection_name("episodes", dims)
    t0 = time.perf_counter()
    chunk = 20
    for first in range(seats.start, seats.stop, chunk):
        notes, eps, skills, profiles, note_pts, ep_pts = [], [], [], [], [], []
        for s in range(first, min(first + chunk, seats.stop)):
            seat = seat_name(s)
            picks = rng.integers(0, len(corpus.notes), size=args.notes)
            vecs = noisy(corpus.note_vecs, picks, args.sigma, rng)
            for r in range(args.notes):
                nid = uuid.uuid4()
                created = now - timedelta(days=float(rng.uniform(0, 300)))
                notes.append(
                    (nid, COMPANY, seat, corpus.notes[picks[r]], "long", "persist_decider", created, 0,
                     vecs[r], MODEL, dims, True)
                )  # fmt: skip
                note_pts.append(note_point(nid, COMPANY, seat, vecs[r], MODEL, None))
            picks = rng.integers(0, len(corpus.turns), size=args.episodes)
            vecs = noisy(corpus.turn_vecs, picks, args.sigma, rng)
            for r in range(args.episodes):
                label, ask, what = corpus.turns[picks[r]]
                end = now - timedelta(days=float(rng.uniform(0, 25)))
                tools = TOOLSETS[(s + r) % len(TOOLSETS)]
                eid = uuid.uuid4()
                eps.append(
                    (eid, COMPANY, seat, ROLE, "raw", f"{seat}-r{r}", label, ask, what, "done", tools, tools,
                     end - timedelta(minutes=4), end, 240_000, now, vecs[r], MODEL, dims, True)
                )  # fmt: skip
                ep_pts.append(episode_point(eid, COMPANY, seat, "done", vecs[r], MODEL))
            for k in range(args.skills):
                topic = TOPICS[k % len(TOPICS)]
                skills.append(
                    (uuid.uuid4(), COMPANY, seat, f"skill-{k:02d}", f"How to {topic} (variant {k})",
                     f"# skill-{k:02d}\n\n1. {topic}\n", TOOLSETS[k % len(TOOLSETS)], "single", 1, [f"{seat}-r{k}"],
                     now, now, now, now, now)
                )  # fmt: skip
            profiles.append(
                (uuid.uuid4(), COMPANY, seat, "slack", "bob", "bob", "Terse; wants the result first.",
                 ["releases", "billing"], 3, now, now)
            )  # fmt: skip
        async with infra.pool.acquire() as conn:
            await conn.copy_records_to_table("agent_diary", records=notes, columns=NOTE_COLS)
            await conn.copy_records_to_table("episodes", records=eps, columns=EPISODE_COLS)
            await conn.copy_records_to_table("synthesized_skills", records=skills, columns=SKILL_COLS)
            await conn.copy_records_to_table("counterparty_profiles", records=profiles, columns=PROFILE_COLS)
        for i in range(0, len(note_pts), 5000):
            await infra.index.upsert(notes_coll, note_pts[i : i + 5000])
        for i in range(0, len(ep_pts), 5000):
            await infra.index.upsert(eps_coll, ep_pts[i : i + 5000])
        done = min(first + chunk, seats.stop)
        if done % 100 == 0 or done == seats.stop:
            log(f"loaded seats {seats.start}..{done - 1} ({time.perf_counter() - t0:.0f}s)")
    for table in ("agent_diary", "episodes", "synthesized_skills", "counterparty_profiles"):
        await infra.pool.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - t0


async def time_turns(stub, seats: list[int], asks: list[str], *, thin: bool, tag: str) -> list[float]:  # type: ignore[no-untyped-def]
    def request(i: int, s: int, ask: str) -> pb.BuildTurnContextRequest:
        return pb.BuildTurnContextRequest(
            company=COMPANY,
            seat=seat_name(s),
            role=ROLE,
            turn_id=f"{tag}-{i}",
            ask="POC-518 got a comment" if thin else ask,
            requires_recon=thin,
            senders=[pb.Counterparty(handle="bob", platform="slack", display_name="Bob")],
            unit_chain=["platform", "engineering"],
        )

    for i in range(10):
        await stub.BuildTurnContext(request(-i - 1, seats[i % len(seats)], asks[i % len(asks)]))  # warm-up
    lat = []
    c0 = time.process_time()
    for i, (s, ask) in enumerate(zip(seats, asks, strict=True)):
        t0 = time.perf_counter()
        resp = await stub.BuildTurnContext(request(i, s, ask))
        lat.append((time.perf_counter() - t0) * 1000)
        if i == 0:
            log(f"{tag}: {resp.summary.line}; embedding {pb.TurnEmbedding.Name(resp.summary.turn_embedding)}")
    CPU_PER_CALL[tag] = (time.process_time() - c0) * 1000 / len(seats)
    return lat


CPU_PER_CALL: dict[str, float] = {}
"""CPU time of this whole process (the caller, every service and the model's threads) per call."""


def db_reset_default() -> None:
    from libs.common import db

    db.configure_pool_reset(False)


def ab_request(i: int, s: int, ask: str, tag: str) -> pb.BuildTurnContextRequest:
    return pb.BuildTurnContextRequest(
        company=COMPANY,
        seat=seat_name(s),
        role=ROLE,
        turn_id=f"{tag}-{i}",
        ask=ask,
        senders=[pb.Counterparty(handle="bob", platform="slack", display_name="Bob")],
        unit_chain=["platform", "engineering"],
    )


async def time_ab(
    stub, seats: list[int], asks: list[str], variants: dict, tag: str, block: int = 1
) -> dict[str, dict[str, list[float]]]:  # type: ignore[no-untyped-def]
    """Rich-trigger calls alternating between the variants ``block`` calls at a time (A, B, A, B, ...
    one call each by default), so both see the same load; per call its wall time and the CPU time of
    this process (server and caller are one process here: the caller's share is the same in every
    variant). A variant that returns an awaitable (a server setting) is awaited before the call."""
    out: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in variants}
    names = list(variants)

    async def switch(name: str) -> None:
        applied = variants[name]()
        if inspect.isawaitable(applied):
            await applied

    for i in range(2 * len(names)):  # warm-up of each variant
        await switch(names[i % len(names)])
        await stub.BuildTurnContext(ab_request(-i - 1, seats[i % len(seats)], asks[i % len(asks)], tag))
    for i, (s, ask) in enumerate(zip(seats, asks, strict=True)):
        name = names[(i // block) % len(names)]
        if i % block == 0:
            await switch(name)
        c0, t0 = time.process_time(), time.perf_counter()
        await stub.BuildTurnContext(ab_request(i, s, ask, tag))
        out[name]["wall"].append((time.perf_counter() - t0) * 1000)
        out[name]["cpu"].append((time.process_time() - c0) * 1000)
    return out


AB_BLOCK = {"commitwait": 25}
"""Calls in a row per variant, where a variant cannot switch between two calls (default 1)."""


async def _synchronous_commit(pool, value: str) -> None:  # type: ignore[no-untyped-def]
    """This scratch server's ``synchronous_commit``, reloaded; the pause lets every backend take the
    reload before the next block of calls (a backend reads it between statements)."""
    await pool.execute(f"ALTER SYSTEM SET synchronous_commit = {value}")
    await pool.execute("SELECT pg_reload_conf()")
    await asyncio.sleep(0.1)


async def span_census(stub, settings, seats: list[int], asks: list[str]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Spans of a rich BuildTurnContext per call, every SQL statement one (``sql_spans: all``):
    how many statements, hops and blocks one turn start makes. Installs the tracer provider."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libs.common import db, telemetry

    exporter = InMemorySpanExporter()
    telemetry.configure_tracing(settings.telemetry, extra_processors=[SimpleSpanProcessor(exporter)])
    configure = getattr(db, "configure_sql_spans", lambda *a: None)  # before it existed: every statement
    configure("all")
    try:
        for i, (s, ask) in enumerate(zip(seats, asks, strict=True)):
            await stub.BuildTurnContext(ab_request(i, s, ask, "census"))
    finally:
        if hasattr(settings.telemetry, "sql_spans"):
            configure(settings.telemetry.sql_spans, settings.telemetry.sql_span_slow_ms)
    spans = exporter.get_finished_spans()
    counts: dict[str, float] = {}
    statements = 0
    for span in spans:
        name = span.name
        if name.startswith("db "):
            statements += 1
            name = "sql " + name[3:]
        counts[name] = counts.get(name, 0) + 1 / len(seats)
    counts["= SQL statements"] = statements / len(seats)
    counts["= all spans"] = len(spans) / len(seats)
    exporter.clear()
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def print_ab(title: str, res: dict[str, dict[str, list[float]]], block: int = 1) -> None:
    (a, ra), (b, rb) = list(res.items())[:2]
    every = "call by call" if block == 1 else f"every {block} calls"
    print(f"\nA/B {title} (alternated {every}, {len(ra['wall'])} calls each)")
    for name, r in res.items():
        print(
            f"  {name:<22} p50 {pct(r['wall'], 50):7.1f} ms  p99 {pct(r['wall'], 99):7.1f} ms  "
            f"mean {sum(r['wall']) / len(r['wall']):7.1f} ms  CPU/call median {pct(r['cpu'], 50):6.1f} ms "
            f"mean {sum(r['cpu']) / len(r['cpu']):6.1f} ms"
        )
    print(
        f"  {b} / {a}: p50 {pct(rb['wall'], 50) / pct(ra['wall'], 50):.2f}x, p99 "
        f"{pct(rb['wall'], 99) / pct(ra['wall'], 99):.2f}x, CPU/call mean "
        f"{(sum(rb['cpu']) / len(rb['cpu'])) / (sum(ra['cpu']) / len(ra['cpu'])):.2f}x"
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads: the model's too)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trees_ab(args: argparse.Namespace) -> int:
    """``--trees this DIR ...``: one prefetch server per tree (each the all-in-one of
    ``bench/experiments/profile_load.py serve-prefetch`` run from that tree's code: its own embedded
    PostgreSQL and index, the same seeded fleet of ``--seats`` x 500/500/20 and the 40 pages, tracing
    on as ./run up), then rich BuildTurnContext calls alternated call by call between the servers, the
    order rotating, so every tree sees the same load. Per tree: p50 / p99 / mean wall ms and the
    server's CPU per call (/proc; its PostgreSQL is another process, not counted), with the ratio to
    the first tree. Only these in-run ratios mean anything on a shared machine."""
    import subprocess

    names = [t.rstrip("/").rsplit("/", 1)[-1] for t in args.trees]
    here = Path(__file__).resolve().parents[1]
    roots = [here if t == "this" else Path(t).resolve() for t in args.trees]
    print(f"uptime at start: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    load = Path("/proc/loadavg").read_text().strip()
    lat, cpu = asyncio.run(_trees_calls(args, names, roots))
    print(f"load average at start {load}, at the end {Path('/proc/loadavg').read_text().strip()}")
    print(
        f"BuildTurnContext, rich trigger, {args.seats} seats x (500 notes, 500 episodes, 20 skills, 1 profile), "
        f"40 pages; {len(lat[0])} calls per tree alternated call by call (order rotating), tracing on"
    )
    header = [
        "tree",
        "calls",
        "p50 ms",
        "p99 ms",
        "mean ms",
        "CPU ms/call",
        "CPU p50",
        f"vs {names[0]} p50/p99/mean/CPU",
    ]
    rows = []
    m0, c0 = sum(lat[0]) / len(lat[0]), sum(cpu[0]) / len(cpu[0])
    for k, name in enumerate(names):
        mean, cmean = sum(lat[k]) / len(lat[k]), sum(cpu[k]) / len(cpu[k])
        ratio = ""
        if k:
            ratio = (
                f"x{pct(lat[k], 50) / pct(lat[0], 50):.2f} / x{pct(lat[k], 99) / pct(lat[0], 99):.2f} / "
                f"x{mean / m0:.2f} / x{cmean / c0:.2f}"
            )
        rows.append([name, str(len(lat[k])), f"{pct(lat[k], 50):.1f}", f"{pct(lat[k], 99):.1f}", f"{mean:.1f}",
                     f"{cmean:.1f}", f"{pct(cpu[k], 50):.1f}", ratio])  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


async def _trees_calls(
    args: argparse.Namespace, names: list[str], roots: list[Path]
) -> tuple[list[list[float]], list[list[float]]]:
    import os

    import grpc

    procs: list[asyncio.subprocess.Process] = []
    channels, stubs = [], []
    lat: list[list[float]] = [[] for _ in roots]
    cpu: list[list[float]] = [[] for _ in roots]
    try:
        for root in roots:
            env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'libs' / 'common' / 'gen'}"}
            argv = [str(root / "bench" / "experiments" / "profile_load.py"), "serve-prefetch"]
            argv += ["--seats", str(args.seats), "--tracing", "on"]
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
                )
            )
        for k, proc in enumerate(procs):
            assert proc.stdout is not None
            while True:
                line = (await asyncio.wait_for(proc.stdout.readline(), 3600)).decode()
                if not line:
                    raise RuntimeError(f"the server of {names[k]} exited before it was ready")
                log(f"[{names[k]}] {line.strip()}")
                if m := re.match(r"PORT (\d+)", line):
                    channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{m.group(1)}"))
                    stubs.append(pb_grpc.PrefetchServiceStub(channels[-1]))
                    break
        prng = random.Random(5)
        plan = [
            (prng.randrange(args.seats), ASKS[i % len(ASKS)].format(t=prng.choice(TOPICS)))
            for i in range(args.ab_queries + 20)
        ]
        for i, (s, ask) in enumerate(plan):
            for n in range(len(stubs)):
                k = (i + n) % len(stubs)
                pid = procs[k].pid
                c0, t0 = _cpu_seconds(pid), time.perf_counter()
                await stubs[k].BuildTurnContext(ab_request(i, s, ask, "trees"))
                wall, used = (time.perf_counter() - t0) * 1000, (_cpu_seconds(pid) - c0) * 1000
                if i >= 20:  # the first 20 of each warm it up
                    lat[k].append(wall)
                    cpu[k].append(used)
    finally:
        for ch in channels:
            await ch.close()
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 120)
            except TimeoutError:
                proc.terminate()
                await proc.wait()
    return lat, cpu


async def main(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    rng = np.random.default_rng(11)
    prng = random.Random(11)
    embedder = loaded_minilm()
    clock = ManualClock()
    with scratch_postgres("prefetch-bench-") as (tmp, server):
        settings = load_settings(
            None,
            {
                "data_dir": str(tmp / "data"),
                "companies": {COMPANY: {"roles": {ROLE: {"knowledge_containers": ["eng"], "unit": "platform"}}}},
            },
            env={},
        )
        results: dict[str, list[float]] = {}
        census: dict[str, float] = {}
        ab_results: dict[str, dict[str, dict[str, list[float]]]] = {}
        if args.tracing:
            # As ./run up: the process's TracerProvider (no exporter), so every span records.
            from libs.common import telemetry

            telemetry.configure_tracing(settings.telemetry)
        async with contextlib.AsyncExitStack() as stack:
            infra, _ = await open_edge_infra(
                stack,
                tmp,
                server.get_uri(),
                migrations_of(NAMES),
                settings,
                clock=clock,
                embedder=embedder,
                pool_size=10,
            )
            components = [SERVICES[n].component(infra) for n in NAMES]
            registrations = [r for c in components for r in c.registrations]
            channel, _ = await serve_loopback(stack, registrations, infra.channels, NAMES)
            stub = pb_grpc.PrefetchServiceStub(channel)

            corpus = Corpus(args.distinct, prng)
            t_embed = await corpus.embed(embedder)
            log(f"embedded {2 * args.distinct} distinct texts once in {t_embed:.1f}s")
            pages = kn_grpc.KnowledgeServiceStub(channel)
            for i, topic in enumerate(TOPICS * 3 + TOPICS[:4]):
                await pages.UpsertPage(
                    kn_pb.UpsertPageRequest(
                        company=COMPANY, container="eng", title=f"Runbook {i}: {topic}", body=f"How to {topic}. " * 20
                    )
                )
            await pages.UpsertPage(
                kn_pb.UpsertPageRequest(
                    company=COMPANY,
                    container="platform",
                    title="Welcome to platform",
                    body="How the team works.",
                    parent_titles=["Onboarding"],
                )
            )

            asks = [ASKS[i % len(ASKS)].format(t=prng.choice(TOPICS)) for i in range(args.queries)]
            t_small = await load_seats(infra, clock, corpus, range(0, args.small), args, rng)
            small_seats = [int(s) for s in rng.integers(0, args.small, size=args.queries)]
            results[f"rich, {args.small} seats"] = await time_turns(stub, small_seats, asks, thin=False, tag="s-rich")
            results[f"thin, {args.small} seats"] = await time_turns(stub, small_seats, asks, thin=True, tag="s-thin")

            t_big = await load_seats(infra, clock, corpus, range(args.small, args.seats), args, rng)
            big_seats = [int(s) for s in rng.integers(0, args.seats, size=args.queries)]
            results[f"rich, {args.seats} seats"] = await time_turns(stub, big_seats, asks, thin=False, tag="b-rich")
            results[f"thin, {args.seats} seats"] = await time_turns(stub, big_seats, asks, thin=True, tag="b-thin")
            if args.census:
                census = await span_census(stub, settings, big_seats[: args.census], asks[: args.census])
            for what in filter(None, args.ab.split(",")):
                ab_seats = [int(s) for s in rng.integers(0, args.seats, size=2 * args.ab_queries)]
                ab_asks = [ASKS[i % len(ASKS)].format(t=prng.choice(TOPICS)) for i in range(2 * args.ab_queries)]
                if what == "inprocess":
                    variants = {
                        "in-process hops": lambda: setattr(infra.channels, "in_process", True),
                        "loopback gRPC hops": lambda: setattr(infra.channels, "in_process", False),
                    }
                elif what == "sqlspans":
                    from libs.common import db

                    variants = {
                        "SQL spans: slow only": lambda: db.configure_sql_spans("slow"),
                        "SQL spans: all": lambda: db.configure_sql_spans("all"),
                    }
                elif what == "poolreset":
                    from libs.common import db

                    variants = {
                        "pool reset: after session state only": lambda: db.configure_pool_reset(False),
                        "pool reset: every release": lambda: db.configure_pool_reset(True),
                    }
                elif what == "commitwait":
                    # Blocks of 25 calls: a reloaded setting reaches the pool's backends between
                    # their statements, not at a known instant.
                    variants = {
                        "commits wait for the WAL flush (as deployed)": lambda: _synchronous_commit(infra.pool, "on"),
                        "commits do not wait (synchronous_commit off)": lambda: _synchronous_commit(infra.pool, "off"),
                    }
                else:
                    raise SystemExit(f"unknown --ab {what!r}: inprocess, sqlspans, poolreset, commitwait")
                block = AB_BLOCK.get(what, 1)
                ab_results[what] = await time_ab(stub, ab_seats, ab_asks, variants, tag=f"ab-{what}", block=block)
                if what == "commitwait":
                    await _synchronous_commit(infra.pool, "on")
                infra.channels.in_process = True
                db_reset_default()
            counts = {
                t: await infra.pool.fetchval(f"SELECT count(*) FROM {t}")
                for t in ("agent_diary", "episodes", "synthesized_skills", "counterparty_profiles")
            }

    total = time.perf_counter() - t_start
    full = (args.seats, args.notes, args.episodes, args.skills) == (1000, 500, 500, 20)
    print()
    print(
        f"scale: {args.seats} seats × ({args.notes} notes, {args.episodes} episodes, {args.skills} skills, "
        f"1 profile)" + ("  (the issue's scale)" if full else "  (SCALED DOWN from 1,000 × 500 / 500 / 20)")
    )
    print("rows: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    print(
        f"vectors: {2 * args.distinct} distinct MiniLM vectors embedded once ({t_embed:.1f}s) and REUSED: each row "
        f"is one of them plus Gaussian noise (sigma {args.sigma}), renormalised; loaded with COPY + index upsert "
        f"({t_small:.0f}s for {args.small} seats, {t_big:.0f}s for the rest)"
    )
    print("auxiliary model: the offline provider (rules), so no model latency is included")
    print()
    header = ["BuildTurnContext over gRPC", "n", "p50 ms", "p99 ms", "CPU ms/call"]
    cpu = list(CPU_PER_CALL.values())
    rows = [
        [name, str(len(lat)), f"{pct(lat, 50):.1f}", f"{pct(lat, 99):.1f}", f"{cpu[i]:.1f}" if i < len(cpu) else ""]
        for i, (name, lat) in enumerate(results.items())
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print()
    for kind in ("rich", "thin"):
        small, big = results[f"{kind}, {args.small} seats"], results[f"{kind}, {args.seats} seats"]
        print(
            f"{kind} trigger, {args.seats} vs {args.small} seats: p50 {pct(big, 50) / pct(small, 50):.2f}x, "
            f"p99 {pct(big, 99) / pct(small, 99):.2f}x"
        )
    rich, thin = results[f"rich, {args.seats} seats"], results[f"thin, {args.seats} seats"]
    print(f"thin vs rich trigger at {args.seats} seats: p50 {pct(thin, 50) / pct(rich, 50):.2f}x")
    if census:
        print(f"\nspans per rich BuildTurnContext ({args.census} calls, every SQL statement a span):")
        for name, n in census.items():
            print(f"  {n:6.2f}  {name}")
    for what, res in ab_results.items():
        title = f"{what}, rich trigger, {args.seats} seats" + (", tracing on" if args.tracing else "")
        print_ab(title, res, AB_BLOCK.get(what, 1))
    print(f"\ntotal bench time {total:.0f}s")
    return 0


if __name__ == "__main__":
    ap = harness.command_line(
        __doc__, seats=1000, small=10, notes=500, episodes=500, skills=20, queries=200, distinct=1500, sigma=0.15
    )
    ap.add_argument(
        "--ab",
        default="",
        help="A/B after the timed phases, alternated call by call at --seats: inprocess (the hops in-process "
        "vs over loopback gRPC), sqlspans (SQL spans of slow statements only vs every one; use with --tracing), "
        "poolreset (asyncpg's reset statement only after session state vs on every release), commitwait "
        "(commits waiting for the WAL flush vs synchronous_commit off: what the disk's flushes cost a turn "
        "start; blocks of 25 calls); comma-separated",
    )
    ap.add_argument("--ab-queries", type=int, default=100, help="calls of each variant in an A/B")
    ap.add_argument("--tracing", action="store_true", help="install the TracerProvider as ./run up does")
    ap.add_argument(
        "--trees",
        nargs="+",
        default=None,
        metavar="TREE",
        help="A/B of checkouts instead of the timed phases: 'this' and other trees (e.g. /tmp/base-068), one "
        "server each loaded alike at --seats, --ab-queries rich calls alternated between them",
    )
    ap.add_argument(
        "--census", type=int, default=0, help="count the spans (every SQL statement one) of N rich calls at --seats"
    )
    parsed = ap.parse_args()
    sys.exit(trees_ab(parsed) if parsed.trees else asyncio.run(main(parsed)))
