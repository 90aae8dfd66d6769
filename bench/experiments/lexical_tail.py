"""RecallNotes' lexical half alone, before/after (issue 14 §4 item 9): the IDF query as shipped
before (bench/locomo.py's ``idf_sql("match")``, each matching note tested against each query lexeme
twice) against
``services.diary.store.SQL["lexical"]`` (whatever the checkout holds), on LoCoMo dev: every turn a
LONG note of its conversation's seat (no vectors: the lexical half does not read them), every
question asked of its seat by both statements in alternating order, plus ``--noise-copies`` copies
of every note in other seats of the same company. Prints p50/p99 per statement, their ratio, and
whether both returned the same notes in the same order with the same ranks. ``--explore`` also
times two intermediate candidates measured on the way (each pair tested once; and narrow rows) —
neither removed the tail, which was the join of the matches to their sums (|matches|² comparisons
under a nested loop the planner picks for CTEs it cannot estimate), fixed by ranking through a
window over the pairs.

    .venv/bin/python bench/experiments/lexical_tail.py [--rounds 3] [--noise-copies 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import scratch_postgres  # noqa: E402
from bench.harness import script as bench_module  # noqa: E402
from services.diary.store import _COLUMNS, SQL  # noqa: E402

_Q = """q AS (
            SELECT lexeme, quote_literal(lexeme)::tsquery AS lq
            FROM unnest(tsvector_to_array(to_tsvector('english', $5))) AS lexeme)"""
_MATCH = """d.company = $1 AND d.seat = $2 AND (d.expire_time IS NULL OR d.expire_time > $3)
              AND d.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM q)"""
_D_COLUMNS = ", ".join(f"d.{c.strip()}" for c in _COLUMNS.split(","))
# Candidates (--explore): each (note, lexeme) tested once, full columns materialised ...
HITS_ONCE = f"""
        WITH {_Q},
        m AS MATERIALIZED (SELECT {_COLUMNS}, d.tsv FROM agent_diary d WHERE {_MATCH}),
        h AS MATERIALIZED (SELECT m.id, q.lexeme FROM m JOIN q ON m.tsv @@ q.lq),
        w AS MATERIALIZED (
            SELECT h.lexeme, ln(1 + ((SELECT count(*) FROM m)::float8 - count(*) + 0.5) / (count(*) + 0.5)) AS idf
            FROM h GROUP BY h.lexeme),
        s AS (SELECT h.id, sum(w.idf) AS rank FROM h JOIN w USING (lexeme) GROUP BY h.id)
        SELECT {_COLUMNS}, s.rank FROM m JOIN s USING (id)
        ORDER BY s.rank DESC, m.create_time DESC LIMIT $4"""
# ... or only (id, create_time, tsv) materialised and the columns read for the top K alone.
HITS_ONCE_NARROW = f"""
        WITH {_Q},
        m AS MATERIALIZED (SELECT d.id, d.create_time, d.tsv FROM agent_diary d WHERE {_MATCH}),
        h AS MATERIALIZED (SELECT m.id, m.create_time, q.lexeme FROM m JOIN q ON m.tsv @@ q.lq),
        w AS MATERIALIZED (
            SELECT h.lexeme, ln(1 + ((SELECT count(*) FROM m)::float8 - count(*) + 0.5) / (count(*) + 0.5)) AS idf
            FROM h GROUP BY h.lexeme),
        top AS MATERIALIZED (
            SELECT h.id, max(h.create_time) AS ct, sum(w.idf) AS rank FROM h JOIN w USING (lexeme)
            GROUP BY h.id ORDER BY rank DESC, ct DESC LIMIT $4)
        SELECT {_D_COLUMNS}, top.rank FROM top JOIN agent_diary d ON d.id = top.id
        ORDER BY top.rank DESC, top.ct DESC"""


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""The first note's create_time; a conversation's notes follow one second apart."""


@contextlib.asynccontextmanager
async def notes_pool(prefix: str, lm, data: list[dict], noise_copies: int):  # type: ignore[no-untyped-def]
    """A scratch PostgreSQL with the diary's tables holding every LoCoMo turn as a LONG note of its
    conversation's seat (no vectors: the lexical half reads none), ``noise_copies`` copies of every
    note in other seats, analysed: the pool, the (seat, question) pairs and the notes' count.
    ``lm`` is bench/locomo.py."""
    from libs.common.config import load_settings
    from libs.common.infra import open_infra
    from services.diary import bootstrap

    with scratch_postgres(prefix) as (tmp, server):
        settings = load_settings(None, {"data_dir": str(tmp / "data")}, env={})
        async with contextlib.AsyncExitStack() as stack:
            infra = await open_infra(
                settings, stack, [bootstrap.MIGRATIONS], embedder=None, dsn=server.get_uri(), pool_size=2
            )  # fmt: skip
            pool = infra.pool
            rows, questions = [], []
            for conv in data:
                seat = conv["sample_id"]
                for i, (date, turn) in enumerate(lm.turns_of(conv["conversation"])):
                    rows.append(
                        (uuid.uuid4(), lm.COMPANY, seat, lm.note_text(turn, date, True, True), "long", "operator",
                         turn["dia_id"], T0 + timedelta(seconds=i))
                    )  # fmt: skip
                questions += [(seat, qa["question"]) for qa in conv["qa"]]
            await pool.executemany(
                """INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
                rows,
            )
            if noise_copies:
                await pool.execute(
                    """INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time)
                       SELECT gen_random_uuid(), company, 'noise-' || g || '-' || seat, content, tier, source,
                              turn_id, create_time
                       FROM agent_diary, generate_series(1, $1::int) AS g WHERE company = $2""",
                    noise_copies,
                    lm.COMPANY,
                )
            await pool.execute("VACUUM ANALYZE agent_diary")
            yield pool, questions, len(rows)


async def main(a: argparse.Namespace) -> None:
    lm = bench_module("locomo")
    data = json.loads(Path(a.data).read_text())  # noqa: ASYNC240 (setup)
    async with notes_pool("lexical-tail-", lm, data, a.noise_copies) as (pool, questions, notes):
        total = await pool.fetchval("SELECT count(*) FROM agent_diary")
        now = T0 + timedelta(days=1)
        # The lexical half as shipped before this change (services/diary/store.py at b76571c) is
        # bench/locomo.py's idf variant with N the matched notes, the very statement.
        stmts = {"before": lm.idf_sql("match"), "after": SQL["lexical"]}
        if a.explore:
            stmts |= {"hits-once": HITS_ONCE, "narrow": HITS_ONCE_NARROW}
        for s in stmts.values():  # prepare and warm
            for seat, q in questions[:20]:
                await pool.fetch(s, lm.COMPANY, seat, now, a.limit, q)
        lat: dict[str, list[float]] = {k: [] for k in stmts}
        same_as = dict.fromkeys(stmts, 0)
        for r in range(a.rounds):
            for i, (seat, q) in enumerate(questions):
                got = {}
                names = list(stmts)
                k = (i + r) % len(names)
                for name in names[k:] + names[:k]:
                    t = time.perf_counter()
                    res = await pool.fetch(stmts[name], lm.COMPANY, seat, now, a.limit, q)
                    lat[name].append(time.perf_counter() - t)
                    got[name] = [(x["id"], round(float(x["rank"]), 9)) for x in res]
                if r == 0:
                    for name in names:
                        same_as[name] += got[name] == got["before"]
        print(
            f"lexical half alone, LoCoMo dev: {notes} notes in {len(data)} seats, {total} rows in the table "
            f"({a.noise_copies} noise copies), {len(questions)} questions x {a.rounds} rounds, K={a.limit}"
        )
        # The neighbours read as RecallNotes runs it after the halves: the top 5 lexical hits as anchors.
        nlat = []
        for seat, q in questions:
            top = await pool.fetch(SQL["lexical"], lm.COMPANY, seat, now, 5, q)
            if top:
                t = time.perf_counter()
                await pool.fetch(
                    SQL["neighbours"], lm.COMPANY, seat, now, [x["create_time"] for x in top], [x["id"] for x in top], 1
                )  # fmt: skip
                nlat.append(time.perf_counter() - t)
        lat["neighbours (5 anchors)"] = nlat
        for name, xs in lat.items():
            print(f"  {name:<22} p50 {pct(xs, 0.5):7.2f} ms  p90 {pct(xs, 0.9):7.2f} ms  p99 {pct(xs, 0.99):7.2f} ms"
                  f"  mean {1000 * statistics.fmean(xs):6.2f} ms")  # fmt: skip
        lat.pop("neighbours (5 anchors)")
        b, f = lat["before"], lat["after"]
        print(
            f"  after/before: p50 x{pct(f, 0.5) / pct(b, 0.5):.2f}, p99 x{pct(f, 0.99) / pct(b, 0.99):.2f}, "
            f"mean x{statistics.fmean(f) / statistics.fmean(b):.2f}"
        )
        for name in stmts:
            print(f"  {name}: same notes, order and ranks as before: {same_as[name]}/{len(questions)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/work/shared/data/locomo-dev.json")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--noise-copies", type=int, default=20)
    p.add_argument("--explore", action="store_true", help="also time the candidate statements")
    asyncio.run(main(p.parse_args()))
