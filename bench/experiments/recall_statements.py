"""The diary recall's reads as today's service runs them against the merged statements (wip/perfread).

    .venv/bin/python bench/experiments/recall_statements.py [--seats 50] [--per-seat 500] [--calls 300]

Before (``services/diary/service.py`` until the wip/perfread merge): the lexical and recency
halves are two statements run side by side, and the vector half's re-read of its hits is
followed by the unreachable count (two statements one after the other). Merged (``PostgresNoteStore.lexical_recent`` and
``hydrate_unreachable``, which the service calls since the merge):
one statement each. The same store, pool (10, as a server's) and PostgreSQL; LoCoMo turns as the
seats' notes (with the date prefix and speaker names that make the lexical half's matches many),
LoCoMo questions as queries, 50 of the seat's note ids standing for the index's hits; the two ways
alternated call by call. Latency of the three halves' reads (not the embed, the index search or the
neighbours read, which both ways share), this process's CPU per call. Both ways' answers are
checked equal on every call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diary import locomo

from bench.harness import Millis, scratch_postgres
from libs.common.db import COMMON_MIGRATIONS, connect_pool, migrate
from services.diary import bootstrap
from services.diary.store import PostgresNoteStore

COLUMNS = ["id", "company", "seat", "content", "tier", "source", "create_time", "embedding", "embedding_model",
           "embedding_dims", "indexed"]  # fmt: skip


def cpu() -> float:
    return sum(os.times()[:2])


async def main(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(3)
    prng = random.Random(3)
    with scratch_postgres("recall-statements-") as (_, server):
        dsn = server.get_uri()
        await migrate(dsn, [COMMON_MIGRATIONS, bootstrap.MIGRATIONS])
        pool = await connect_pool(dsn, max_size=10)
        texts, questions = locomo(Path(args.data))
        base = datetime.now(UTC) - timedelta(days=30)
        ids: dict[str, list[uuid.UUID]] = {}
        for s in range(args.seats):
            seat = f"seat-{s:04d}"
            records = []
            for j, t in enumerate(rng.choice(len(texts), size=args.per_seat, replace=False)):
                nid = uuid.uuid4()
                vec = None if j % 20 == 0 else rng.normal(size=384).astype(np.float32)  # 5% without a vector
                model, dims = (None, None) if vec is None else ("m", 384)
                at = base + timedelta(minutes=j)
                indexed = vec is not None
                records.append((nid, "bench", seat, texts[t], "long", "operator", at, vec, model, dims, indexed))
                ids.setdefault(seat, []).append(nid)
            await pool.copy_records_to_table("agent_diary", records=records, columns=COLUMNS)
        await pool.execute("VACUUM ANALYZE agent_diary")
        store = PostgresNoteStore(pool)
        now = datetime.now(UTC)

        async def today(seat: str, q: str, hits: list[uuid.UUID]) -> tuple[object, ...]:
            async def vector() -> tuple[object, int]:
                notes = await store.hydrate("bench", seat, hits, now)
                return notes, await store.unreachable_by_vector("bench", seat, now, "m", 384)

            (notes, unreachable), lexical, recent = await asyncio.gather(
                vector(), store.lexical("bench", seat, now, q, 50), store.recent("bench", seat, now, 50)
            )
            return notes, unreachable, lexical, recent

        async def merged(seat: str, q: str, hits: list[uuid.UUID]) -> tuple[object, ...]:
            (notes, unreachable), (lexical, recent) = await asyncio.gather(
                store.hydrate_unreachable("bench", seat, hits, now, "m", 384),
                store.lexical_recent("bench", seat, now, q, 50, 50),
            )
            return notes, unreachable, lexical, recent

        ways = {"today: 4 statements (2 + 1 then 1)": today, "merged: 2 statements side by side": merged}
        lat: dict[str, list[float]] = {k: [] for k in ways}
        used: dict[str, float] = dict.fromkeys(ways, 0.0)
        seats = sorted(ids)
        for i in range(args.calls + 20):
            seat, q = prng.choice(seats), prng.choice(questions)
            hits = prng.sample(ids[seat], 50)
            answers = []
            for name in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                c0, t0 = cpu(), time.perf_counter()
                answers.append(await ways[name](seat, q, hits))
                if i >= 20:  # the first 20: warm-up (plans, caches)
                    lat[name].append(time.perf_counter() - t0)
                    used[name] += cpu() - c0
            a, b = answers
            assert a[0] == b[0] and a[1] == b[1], "hydrate/unreachable differ"
            assert [(n.id, r) for n, r in a[2]] == [(n.id, r) for n, r in b[2]], "lexical differs"  # type: ignore[attr-defined]
            assert [n.id for n in a[3]] == [n.id for n in b[3]], "recency differs"  # type: ignore[attr-defined]
        print(
            f"{args.seats} seats x {args.per_seat} notes, {args.calls} calls each, alternated; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        for name, xs in lat.items():
            ms = Millis.of(xs)
            print(
                f"  {name}: p50 {ms.p50:.2f} ms, p90 {ms.p90:.2f}, p99 {ms.p99:.2f}, mean {ms.mean:.2f}; "
                f"CPU {1000 * used[name] / len(xs):.2f} ms a call"
            )
        t, m = (lat[k] for k in ways)
        ct, cm = (used[k] for k in ways)
        print(
            f"  merged / today: p50 x{statistics.median(m) / statistics.median(t):.2f}, "
            f"p99 x{sorted(m)[int(0.99 * len(m))] / sorted(t)[int(0.99 * len(t))]:.2f}, "
            f"mean x{statistics.fmean(m) / statistics.fmean(t):.2f}, CPU x{cm / ct:.2f}; every answer equal"
        )
        await pool.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seats", type=int, default=50)
    ap.add_argument("--per-seat", type=int, default=500)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--data", default="/work/shared/data/locomo-dev.json")
    asyncio.run(main(ap.parse_args()))
