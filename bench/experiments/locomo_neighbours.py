"""LoCoMo dev, from the pools bench/experiments/locomo_block.py cached: what a "neighbours" half
would add to the pool — the notes the seat wrote just before and after the best hits (a fact is
often stated over adjacent turns; in the product, the seat's notes nearest in create_time) — and
what dropping the recency half costs. Measurement only.

    .venv/bin/python bench/experiments/locomo_neighbours.py [--pool-cache /tmp/locomo-pools.pkl]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import script  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool-cache", type=Path, default=Path("/tmp/locomo-pools.pkl"))
    ap.add_argument("--data", default="/work/shared/data/locomo-dev.json")
    a = ap.parse_args()
    lb = script("experiments/locomo_block", "locomo_block")
    lm = lb.bench_module("locomo")
    qs = pickle.loads(a.pool_cache.read_bytes())["questions"]
    order: dict[str, list[str]] = {}
    for conv in json.loads(Path(a.data).read_text()):
        order[conv["sample_id"]] = [t["dia_id"] for _, t in lm.turns_of(conv["conversation"])]
    pos = {seat: {d: i for i, d in enumerate(ids)} for seat, ids in order.items()}

    def recall(pick) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        hit = items = 0
        sizes = []
        for q in qs:
            got = pick(q)
            hit += sum(e in got for e in q["evidence"])
            items += len(q["evidence"])
            sizes.append(len(got))
        return 100 * hit / items, sum(sizes) / len(sizes)

    def halves(q, names):  # type: ignore[no-untyped-def]
        return {c["dia"] for c in q["pool"] if set(c["found_by"]) & names}

    def neighbours(q, top: int, radius: int) -> set[str]:  # type: ignore[no-untyped-def]
        f = lb.fused(q["pool"])
        best = sorted(range(len(q["pool"])), key=lambda i: -f[i])[:top]
        ids, p = order[q["seat"]], pos[q["seat"]]
        out = set()
        for i in best:
            k = p[q["pool"][i]["dia"]]
            out.update(ids[max(0, k - radius) : k + radius + 1])
        return out

    rows = [
        ("pool today (vector 50 + lexical 50 + recency 50)", lambda q: halves(q, {"vector", "lexical", "recency"})),
        ("vector + lexical only (no recency half)", lambda q: halves(q, {"vector", "lexical"})),
    ]
    for top, radius in ((5, 1), (5, 2), (10, 1), (10, 2), (20, 1)):
        rows.append(
            (f"vector + lexical + neighbours of the top {top} fused (+-{radius})",
             lambda q, t=top, r=radius: halves(q, {"vector", "lexical"}) | neighbours(q, t, r))
        )  # fmt: skip
    rows.append(
        ("pool today + neighbours of the top 10 fused (+-1)",
         lambda q: halves(q, {"vector", "lexical", "recency"}) | neighbours(q, 10, 1))
    )  # fmt: skip
    print(f"{'pool':<66} {'recall micro %':>14} {'mean size':>9}")
    for name, pick in rows:
        r, size = recall(pick)
        print(f"{name:<66} {r:14.1f} {size:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
