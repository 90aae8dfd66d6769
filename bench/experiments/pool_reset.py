"""What asyncpg's reset statement costs a pooled statement (wip/perfread, issue 14).

    .venv/bin/python bench/experiments/pool_reset.py [--windows 10] [--per-window 400]

asyncpg sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;`` every time a
connection goes back to its pool, and ``pool.fetch`` awaits it: two round trips a statement.
``libs/common/db.py`` now sends it only after a statement that may have left session state. Two
pools on one embedded PostgreSQL, the product's (``connect_pool``) and the same with the reset on
every release (``RESET_ALWAYS``), run a recency-like read (50 rows of a 500-row seat by the index)
in alternating windows; per window the statement's latency, this process's CPU and PostgreSQL's
(every postgres process, /proc): only one pool runs at a time, so each window's PostgreSQL CPU is
its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import asyncpg
import numpy as np

from bench.harness import Millis, scratch_postgres
from libs.common.db import TracedConnection, _init_connection, connect_pool

READ = "SELECT id, n, body FROM rows WHERE seat = $1 ORDER BY n DESC LIMIT 50"


class ResetAlways(TracedConnection):
    def get_reset_query(self) -> str:
        self._session_changed = True  # as asyncpg does: every release
        return super().get_reset_query()


def cpu(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def postgres_pids(data_dir: Path) -> list[int]:
    """This server's postmaster and its children (other engineers' PostgreSQLs run here too)."""
    master = int((data_dir / "postmaster.pid").read_text().split()[0])
    out = [master]
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == master:
                    out.append(int(p.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


async def main(args: argparse.Namespace) -> None:
    with scratch_postgres("pool-reset-") as (tmp, server):
        dsn = server.get_uri()
        setup = await asyncpg.connect(dsn)
        await setup.execute("CREATE EXTENSION IF NOT EXISTS vector")  # connect_pool's codec needs the type
        await setup.execute("CREATE TABLE rows (id uuid DEFAULT gen_random_uuid(), seat int, n int, body text)")
        await setup.execute(
            "INSERT INTO rows (seat, n, body) SELECT s, n, repeat('x', 200) FROM generate_series(1, 50) s,"
            " generate_series(1, 500) n"
        )
        await setup.execute("CREATE INDEX ON rows (seat, n DESC)")
        await setup.execute("VACUUM ANALYZE rows")
        await setup.close()
        pools = {
            "product (reset only after session state)": await connect_pool(dsn, max_size=4),
            "reset on every release (asyncpg's default)": await asyncpg.create_pool(
                dsn, min_size=1, max_size=4, connection_class=ResetAlways, init=_init_connection
            ),
        }
        lat: dict[str, list[float]] = {k: [] for k in pools}
        own: dict[str, float] = dict.fromkeys(pools, 0.0)
        pg: dict[str, float] = dict.fromkeys(pools, 0.0)
        rng = np.random.default_rng(1)
        for pool in pools.values():  # warm: statements prepared, pages cached
            for _ in range(50):
                await pool.fetch(READ, int(rng.integers(1, 51)))
        me = [os.getpid()]
        for w in range(args.windows):
            for name in list(pools) if w % 2 == 0 else list(pools)[::-1]:
                pids = postgres_pids((tmp / "pg").resolve())
                c0, p0 = cpu(me), cpu(pids)
                for _ in range(args.per_window):
                    t = time.perf_counter()
                    await pools[name].fetch(READ, int(rng.integers(1, 51)))
                    lat[name].append(time.perf_counter() - t)
                own[name] += cpu(me) - c0
                pg[name] += cpu(pids) - p0
        n = args.windows * args.per_window
        load = os.getloadavg()[0]
        print(f"pooled 50-row read, {args.windows} alternating windows x {args.per_window}; load {load:.1f}")
        for name, xs in lat.items():
            ms = Millis.of(xs)
            print(
                f"  {name}: p50 {ms.p50:.3f} ms, p99 {ms.p99:.3f} ms, "
                f"mean {ms.mean:.3f} ms; client CPU {1000 * own[name] / n:.3f} ms, "
                f"PostgreSQL CPU {1000 * pg[name] / n:.3f} ms a statement"
            )
        a, b = list(lat)
        print(
            f"  product / always: p50 x{statistics.median(lat[a]) / statistics.median(lat[b]):.2f}, "
            f"mean x{statistics.fmean(lat[a]) / statistics.fmean(lat[b]):.2f}, "
            f"client CPU x{own[a] / own[b]:.2f}, PostgreSQL CPU x{pg[a] / pg[b]:.2f}"
        )
        for pool in pools.values():
            await pool.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--per-window", type=int, default=400)
    asyncio.run(main(ap.parse_args()))
