"""EXPLAIN (ANALYZE, BUFFERS) of RecallNotes' lexical half before/after on LoCoMo dev (the table of
lexical_tail.py: every turn a note of its seat, 20 noise copies in other seats): how many notes a
question matches (p50/p90/max), then both plans for the question matching the most and for the
median one. These are custom plans (a statement run a few times), which is where the old
statement's |matches|² nested loop shows.

    .venv/bin/python bench/experiments/lexical_explain.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from bench.harness import script  # noqa: E402
from services.diary.store import SQL  # noqa: E402

lt = script("experiments/lexical_tail", "lexical_tail")

_MATCHES = """SELECT count(*) FROM agent_diary d WHERE d.company = $1 AND d.seat = $2 AND d.tsv @@ (
    SELECT string_agg(quote_literal(l), ' | ')::tsquery FROM unnest(tsvector_to_array(to_tsvector('english', $3))) l)"""


async def main(data: list[dict]) -> None:
    lm = lt.bench_module("locomo")
    async with lt.notes_pool("lexical-explain-", lm, data, 20) as (pool, qs, _):
        now = lt.T0 + timedelta(days=1)
        counts = sorted([(await pool.fetchval(_MATCHES, lm.COMPANY, s, q), s, q) for s, q in qs], reverse=True)
        print(
            f"matches per question: p50 {statistics.median(c[0] for c in counts)}, "
            f"p90 {counts[len(counts) // 10][0]}, max {counts[0][0]}"
        )
        for n, seat, q in (counts[0], counts[len(counts) // 2]):
            print(f"==== {n} matches: {q}")
            for name, stmt in (("before", lt.BEFORE), ("after", SQL["lexical"])):
                for _ in range(3):
                    await pool.fetch(stmt, lm.COMPANY, seat, now, 50, q)
                plan = await pool.fetch("EXPLAIN (ANALYZE, BUFFERS) " + stmt, lm.COMPANY, seat, now, 50, q)
                print(f"-- {name}")
                print("\n".join(r[0] for r in plan))


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path("/work/shared/data/locomo-dev.json").read_text())))
