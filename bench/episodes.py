"""SearchEpisodes latency at fleet scale, and the lifecycle pass on a seat that is due.

    ./run bench episodes [--seats 1000] [--rows 500] [--queries 300] [--distinct 2000]
                         [--lifecycle-rows 5000] [--sigma 0.15]

Everything is the real service in-process: an embedded PostgreSQL (temporary data directory, the
common and episodes migrations), Qdrant's embedded engine (temporary directory), the local MiniLM
embedder, the offline auxiliary rules, a ManualClock, and ``EpisodeService`` served over gRPC on a
loopback port (``services.episodes.bootstrap.component``); every search is a real gRPC call.

Part 1, search. ``--seats`` × ``--rows`` raw rows (company ``bench``) are bulk-loaded straight into
``episodes`` with COPY and into the index with ``upsert``, already marked indexed — RecordEpisode
would embed each row inline, which for 500,000 rows is hours of MiniLM on two cores. Instead
``--distinct`` distinct turn texts (label, ask, account) are embedded once with MiniLM, and each
row takes one of them plus Gaussian noise (``--sigma`` of the vector's norm, renormalised), so rows
of one seat are near but not identical. The honest consequence: the similarity structure is
synthetic; the latency (index filter per seat, hydration from Postgres, the lexical GIN half, gRPC)
is what is measured. Timed, per variant, ``--queries`` calls on random seats after a warm-up:

* ``query text``: SearchEpisodes with a query string (the inline MiniLM embed included);
* ``provided vector``: the same with a precomputed ``query_embedding`` (search cost alone);
* ``vector only``: provided vector, lexical half off;
* ``exact scan``: provided vector, lexical off, the index closed (the fallback path).

Part 2, lifecycle. One more seat (company ``bench-lc``) gets ``--lifecycle-rows`` rows aged 31 to
400 days: 5 % self_iterate, 10 % tool-free, the rest drawn from 12 tool-set patterns (order shuffled,
an occasional extra tool), a third of them with asks past 280 bytes (so condensation runs, offline).
The pass then runs as the runner runs it: every fleet seat costs its one gate count (each has
exactly 500 raw rows, at the threshold, so none is due), the lifecycle seat the full pass. It runs
again until a pass folds nothing (each pass folds at most ``compaction_batch_size`` = 200 rows).
Reported: the gate-only pass time over the fleet, each pass's time, rows before and after, and the
compaction ratio (turns a compacted row stands for; and the seat's stored bytes before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import sys
import time
import uuid
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

import numpy as np  # noqa: E402

from agentlearn.common.v1 import embedding_pb2  # noqa: E402
from agentlearn.episodes.v1 import episode_service_pb2 as pb  # noqa: E402
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc  # noqa: E402
from bench import harness  # noqa: E402
from bench.harness import loaded_minilm, noisy, open_edge_infra, pct, scratch_postgres, serve_loopback  # noqa: E402
from bench.harness.workplace import PEOPLE, TOOLSETS, TOPICS  # noqa: E402
from libs.common.clock import ManualClock  # noqa: E402
from libs.common.config import load_settings  # noqa: E402
from libs.common.vectorindex import collection_name  # noqa: E402
from services.episodes import bootstrap  # noqa: E402
from services.episodes.domain import vector_text  # noqa: E402
from services.episodes.service import index_point  # noqa: E402

COMPANY, LC_COMPANY, LC_SEAT = "bench", "bench-lc", "lifecycle-seat"
SURFACES = ["Slack message", "Jira ticket", "email", "GitHub review request", "PagerDuty alert"]
ACCOUNTS = ["Done; posted the result in the thread.", "Opened a PR and asked for review.", "Could not finish."]
QUERIES = [
    "the nightly build keeps failing",
    "who asked for the weekly report?",
    "database password rotation",
    "billing export is slow",
    "certificate about to expire",
    "memory keeps growing in a worker",
    "write up what happened during the outage",
    "team dinner",
]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def distinct_turns(n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    out = []
    for i in range(n):
        person, surface, topic = rng.choice(PEOPLE), rng.choice(SURFACES), TOPICS[i % len(TOPICS)]
        label = f"Message from {person}: {surface}"
        ask = f"{person} asks: could you {topic}? Reference #{i}." if i % 7 else ""
        out.append((label, ask, f"{rng.choice(ACCOUNTS)} ({topic})"))
    return out


async def bulk_load(infra, clock, turns, base, args, rng: np.random.Generator) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """COPY --seats × --rows raw rows with perturbed vectors; upsert the same into the index."""
    cols = [
        "id", "company", "seat", "kind", "turn_id", "label", "ask", "what_it_did", "outcome",
        "tool_sequence", "tools_called", "start_time", "end_time", "duration_ms", "record_time",
        "embedding", "embedding_model", "embedding_dims", "indexed",
    ]  # fmt: skip
    now = clock.now()
    coll = collection_name("episodes", base.shape[1])
    t_pg = t_ix = 0.0
    chunk = 20
    for first in range(0, args.seats, chunk):
        records, points = [], []
        for s in range(first, min(first + chunk, args.seats)):
            seat = f"seat{s:04d}"
            pick = rng.integers(0, len(turns), size=args.rows)
            vecs = noisy(base, pick, args.sigma, rng)
            for r in range(args.rows):
                label, ask, what = turns[pick[r]]
                end = now - timedelta(days=float(rng.uniform(0, 25)))
                tools = TOOLSETS[(s + r) % len(TOOLSETS)]
                rid = uuid.uuid4()
                records.append(
                    (rid, COMPANY, seat, "raw", f"{seat}-r{r}", label, ask, what, "done", tools, tools,
                     end - timedelta(minutes=4), end, 240_000, now, vecs[r], "all-MiniLM-L6-v2", base.shape[1], True)
                )  # fmt: skip
                points.append(index_point(rid, COMPANY, seat, "done", vecs[r], "all-MiniLM-L6-v2"))
        t0 = time.perf_counter()
        async with infra.pool.acquire() as conn:
            await conn.copy_records_to_table("episodes", records=records, columns=cols)
        t_pg += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(0, len(points), 5000):
            await infra.index.upsert(coll, points[i : i + 5000])
        t_ix += time.perf_counter() - t0
        log(f"loaded {min(first + chunk, args.seats)}/{args.seats} seats (pg {t_pg:.0f}s, index {t_ix:.0f}s)")
    return t_pg, t_ix


async def time_searches(stub, requests: list[pb.SearchEpisodesRequest]) -> tuple[list[float], list[int]]:  # type: ignore[no-untyped-def]
    for req in requests[:20]:
        await stub.SearchEpisodes(req)  # warm-up
    lat, sources = [], []
    for req in requests:
        t0 = time.perf_counter()
        resp = await stub.SearchEpisodes(req)
        lat.append((time.perf_counter() - t0) * 1000)
        sources.append(resp.vector_source)
    return lat, sources


async def lifecycle_seat(infra, clock, n: int, rng: random.Random) -> None:  # type: ignore[no-untyped-def]
    cols = [
        "id", "company", "seat", "kind", "turn_id", "label", "ask", "what_it_did", "outcome",
        "tool_sequence", "tools_called", "start_time", "end_time", "duration_ms", "record_time",
    ]  # fmt: skip
    now = clock.now()
    records = []
    for i in range(n):
        end = now - timedelta(days=rng.uniform(31, 400))
        roll = rng.random()
        outcome = "self_iterate" if roll < 0.05 else ("failed" if roll < 0.2 else "done")
        if rng.random() < 0.10:
            tools: list[str] = []
        else:
            tools = list(rng.choice(TOOLSETS))
            rng.shuffle(tools)
            if rng.random() < 0.2:
                tools.append(rng.choice(["slack.post", "jira.comment", "web.fetch"]))
        topic = rng.choice(TOPICS)
        ask = f"Could you {topic}?"
        if rng.random() < 0.33:
            trace = " ".join(f"Traceback frame {k}: module_{i}_{k}.py line {k * 11}" for k in range(9))
            ask += f" Context follows. {trace}"
        records.append(
            (uuid.uuid4(), LC_COMPANY, LC_SEAT, "raw", f"lc-{i}", f"Message from {rng.choice(PEOPLE)}: Slack message",
             ask, f"{rng.choice(ACCOUNTS)} ({topic})", outcome, tools, tools, end - timedelta(minutes=3), end,
             180_000, now)
        )  # fmt: skip
    async with infra.pool.acquire() as conn:
        await conn.copy_records_to_table("episodes", records=records, columns=cols)


async def seat_stats(pool) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    row = await pool.fetchrow(
        """SELECT count(*) FILTER (WHERE kind = 'raw') AS raw, count(*) FILTER (WHERE kind = 'compacted') AS comp,
                  coalesce(sum(pg_column_size(e.*)), 0) AS bytes
           FROM episodes e WHERE company = $1 AND seat = $2""",
        LC_COMPANY,
        LC_SEAT,
    )
    return int(row["raw"]), int(row["comp"]), int(row["bytes"])


async def main(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    rng = np.random.default_rng(7)
    prng = random.Random(7)
    embedder = loaded_minilm()
    clock = ManualClock()
    with scratch_postgres("episodes-bench-") as (tmp, server):
        settings = load_settings(None, {"data_dir": str(tmp / "data")}, env={})
        async with contextlib.AsyncExitStack() as stack:
            infra, index = await open_edge_infra(
                stack,
                tmp,
                server.get_uri(),
                [bootstrap.MIGRATIONS],
                settings,
                clock=clock,
                embedder=embedder,
                pool_size=4,
            )
            comp = bootstrap.component(infra)
            channel, _ = await serve_loopback(stack, comp.registrations)
            stub = pb_grpc.EpisodeServiceStub(channel)

            # ---- embed the distinct texts once
            turns = distinct_turns(args.distinct, prng)
            t0 = time.perf_counter()
            vecs = []
            for i in range(0, len(turns), 256):
                vecs += await embedder.embed([vector_text(*t) for t in turns[i : i + 256]])
            base = np.stack([v.values for v in vecs]).astype(np.float32)
            t_embed = time.perf_counter() - t0
            log(f"embedded {len(turns)} distinct texts in {t_embed:.1f}s")

            # ---- bulk load
            t_pg, t_ix = await bulk_load(infra, clock, turns, base, args, rng)
            t0 = time.perf_counter()
            await infra.pool.execute("VACUUM ANALYZE episodes")
            t_vac = time.perf_counter() - t0
            total_rows = await infra.pool.fetchval("SELECT count(*) FROM episodes")

            # ---- searches
            seats = [f"seat{int(s):04d}" for s in rng.integers(0, args.seats, size=args.queries)]
            qtexts = [QUERIES[i % len(QUERIES)] for i in range(args.queries)]
            qvecs = {q: v for q, v in zip(QUERIES, await embedder.embed(QUERIES), strict=True)}

            def provided(q: str) -> embedding_pb2.Embedding:
                v = qvecs[q]
                return embedding_pb2.Embedding(values=v.tolist(), model=v.model, dimensions=v.dimensions)

            variants = {
                "query text (inline embed)": [
                    pb.SearchEpisodesRequest(company=COMPANY, seat=s, query=q)
                    for s, q in zip(seats, qtexts, strict=True)
                ],
                "provided vector": [
                    pb.SearchEpisodesRequest(company=COMPANY, seat=s, query=q, query_embedding=provided(q))
                    for s, q in zip(seats, qtexts, strict=True)
                ],
                "vector only": [
                    pb.SearchEpisodesRequest(company=COMPANY, seat=s, query_embedding=provided(q), lexical_limit=0)
                    for s, q in zip(seats, qtexts, strict=True)
                ],
            }
            timings: dict[str, list[float]] = {}
            for name, reqs in variants.items():
                lat, sources = await time_searches(stub, reqs)
                assert set(sources) == {embedding_pb2.VECTOR_SOURCE_INDEX}, sources
                timings[name] = lat
                log(f"{name}: p50 {pct(lat, 50):.1f} ms")

            # ---- the fill with nothing to do, at this size
            fill_spec = next(p for p in comp.passes if p.name == "episode-fill")
            t0 = time.perf_counter()
            fill_result = await fill_spec.run()
            t_fill = time.perf_counter() - t0
            assert fill_result["fill"].requests == 0

            # ---- lifecycle: gate-only pass over the fleet, then a due seat
            lc_spec = next(p for p in comp.passes if p.name == "episode-lifecycle")
            t0 = time.perf_counter()
            gate_report = await lc_spec.run()
            t_gate = time.perf_counter() - t0
            assert gate_report.seats_due == 0, gate_report
            await lifecycle_seat(infra, clock, args.lifecycle_rows, prng)
            await infra.pool.execute("ANALYZE episodes")
            raw0, comp0, bytes0 = await seat_stats(infra.pool)
            passes_run: list[tuple[float, object]] = []
            while True:
                t0 = time.perf_counter()
                report = await lc_spec.run()
                passes_run.append((time.perf_counter() - t0, report))
                if report.clusters_compacted == 0 or len(passes_run) >= args.max_passes:
                    break
            raw1, comp1, bytes1 = await seat_stats(infra.pool)
            first_report = passes_run[0][1]
            folded = sum(r.episodes_compacted for _, r in passes_run)
            clusters = sum(r.clusters_compacted for _, r in passes_run)

            # ---- exact scan: the index goes away (last, it cannot come back in this process)
            logging.getLogger("services.episodes.service").setLevel(logging.ERROR)  # one warning a call
            await index.close()
            lat, sources = await time_searches(stub, variants["vector only"])
            assert set(sources) == {embedding_pb2.VECTOR_SOURCE_EXACT_SCAN}
            timings["exact scan (index down)"] = lat

    total = time.perf_counter() - t_start
    scaled = args.seats != 1000 or args.rows != 500 or args.lifecycle_rows != 5000
    print()
    print(
        f"scale: {args.seats} seats × {args.rows} raw rows = {total_rows:,} rows"
        + ("  (SCALED DOWN from 1,000 × 500 / 5,000)" if scaled else "  (the issue's scale)")
    )
    print(
        f"vectors: {args.distinct} distinct MiniLM vectors embedded once ({t_embed:.1f}s), each row one of them "
        f"plus Gaussian noise (sigma {args.sigma}), renormalised — synthetic similarity, real latency"
    )
    print(f"load: COPY {t_pg:.0f}s, index upsert {t_ix:.0f}s, VACUUM ANALYZE {t_vac:.0f}s")
    print()
    base_p50 = pct(timings["vector only"], 50)
    header = ["SearchEpisodes over gRPC", "n", "p50 ms", "p99 ms", "p50 vs vector only"]
    rows = [
        [name, str(len(lat)), f"{pct(lat, 50):.1f}", f"{pct(lat, 99):.1f}", f"{pct(lat, 50) / base_p50:.2f}x"]
        for name, lat in timings.items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print()
    print(f"episode-fill minute with nothing pending over {total_rows:,} rows: {t_fill * 1000:.0f} ms")
    print(
        f"episode-lifecycle, gate only ({gate_report.seats_checked} seats, none due): {t_gate * 1000:.0f} ms "
        f"({t_gate / max(1, gate_report.seats_checked) * 1000:.2f} ms a seat)"
    )
    print(
        f"episode-lifecycle, one seat of {args.lifecycle_rows:,} rows due (+ the fleet's gate counts): "
        f"first pass {passes_run[0][0]:.2f}s — dropped {first_report.non_terminal_dropped} non-terminal, "
        f"{first_report.tool_free_dropped} tool-free; folded {first_report.episodes_compacted} rows into "
        f"{first_report.clusters_compacted} compacted rows; {first_report.condensed} condensations (offline rules)"
    )
    times = [t for t, _ in passes_run]
    print(
        f"  until nothing folds: {len(passes_run)} passes, {sum(times):.1f}s in all "
        f"(median {statistics.median(times):.2f}s a pass); {folded} rows folded into {clusters} compacted rows "
        f"= {folded / max(1, clusters):.1f} turns per compacted row"
    )
    print(
        f"  seat rows {raw0 + comp0:,} -> {raw1 + comp1:,} ({raw1:,} raw + {comp1:,} compacted); "
        f"stored bytes {bytes0 / 1e6:.2f} MB -> {bytes1 / 1e6:.2f} MB ({bytes0 / max(1, bytes1):.1f}x smaller)"
    )
    print(f"\ntotal bench time {total:.0f}s")
    return 0


if __name__ == "__main__":
    ap = harness.command_line(
        __doc__, seats=1000, rows=500, queries=300, distinct=2000, sigma=0.15, lifecycle_rows=5000, max_passes=40
    )
    sys.exit(asyncio.run(main(ap.parse_args())))
