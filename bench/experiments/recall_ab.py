"""RecallNotes A/B of two checkouts' diary servers over gRPC (wip/vecpath: the shared vector path
against the code it replaced): one embedded PostgreSQL with ``--seats`` x ``--per-seat`` LoCoMo
notes (bench/diary.py's loader: rows by COPY, points into an edge index copied for each server),
both servers started as bench/diary.py starts its own (``--serve``, the other checkout's script and
code via PYTHONPATH), then ``--windows`` alternating windows (the order flips every window) of
``--calls`` RecallNotes each, every call asked in both modes (query vector precomputed; query
embedded by the server). Prints p50/p90 per server and mode, server CPU per call, and the ratios.
Also checks that both servers answered every call with the same candidates (ids, halves, order).

    .venv/bin/python bench/experiments/recall_ab.py DIR [--windows 6] [--calls 60]

DIR: the other checkout (e.g. ``git archive <commit> | tar -x -C /tmp/base`` plus this checkout's
``libs/common/gen``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.diary import (
    DEFAULT_DATA,
    ServerProcess,
    cpu_seconds,
    load_ab,
    recall_request,
)
from bench.harness import command_line, scratch_postgres


async def main(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    prng = random.Random(args.seed)
    with scratch_postgres("recall-ab-") as (tmp, server):
        dsn = server.get_uri()
        company = "bench-ab"
        seats = [f"seat-{i:04d}" for i in range(args.seats)]
        questions, qvecs, model = await load_ab(
            dsn, Path(args.data), args.turns, args.questions, seats, args.per_seat, tmp / "edge-load", rng
        )
        # Both servers read a copy: when "this" served the directory the load wrote and "compare"
        # its copy, "this" was 17-23% slower at p50 whichever checkout it was (two runs, swapped).
        shutil.copytree(tmp / "edge-load", tmp / "edge-this")
        shutil.copytree(tmp / "edge-load", tmp / "edge-compare")
        modes = [("precomputed", True), ("embedded", False)]
        names = ["this", f"compare ({args.other})"]
        lat: list[dict[str, list[float]]] = [{m: [] for m, _ in modes}, {m: [] for m, _ in modes}]
        cpu, calls, mismatches = [0.0, 0.0], [0, 0], 0
        async with contextlib.AsyncExitStack() as stack:
            servers = [
                await stack.enter_async_context(ServerProcess(dsn, tmp / "edge-this", tmp / "data-this")),
                await stack.enter_async_context(
                    ServerProcess(dsn, tmp / "edge-compare", tmp / "data-compare", Path(args.other))
                ),
            ]
            for w in range(-1, args.windows):  # window -1 warms both (model, pool, shards); not counted
                plan = [(prng.choice(seats), prng.randrange(len(questions))) for _ in range(args.calls)]
                answers: list[list[list[tuple[str, tuple[int, ...]]]]] = [[], []]
                for k in (0, 1) if w % 2 == 0 else (1, 0):
                    pid = servers[k].proc.pid  # type: ignore[union-attr]
                    c0 = cpu_seconds(pid)
                    for seat, qi in plan:
                        for name, pre in modes:
                            req = recall_request(company, seat, questions[qi], qvecs[qi] if pre else None, model)
                            t = time.perf_counter()
                            resp = await servers[k].stub.RecallNotes(req)  # type: ignore[union-attr]
                            if w >= 0:
                                lat[k][name].append(time.perf_counter() - t)
                            answers[k].append([(c.note.id, tuple(c.found_by)) for c in resp.candidates])
                    if w >= 0:
                        cpu[k] += cpu_seconds(pid) - c0
                        calls[k] += 2 * len(plan)
                mismatches += sum(a != b for a, b in zip(answers[0], answers[1], strict=True))
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"RecallNotes A/B: {args.seats} seats x {args.per_seat} notes, {args.windows} windows x {args.calls} "
            f"calls x 2 modes per server; load {load}"
        )
        p = lambda xs, q: float(np.percentile(xs, q)) * 1000  # noqa: E731
        for k in (0, 1):
            parts = ", ".join(f"{m} p50 {p(lat[k][m], 50):.1f} ms p90 {p(lat[k][m], 90):.1f} ms" for m, _ in modes)
            print(f"  {names[k]}: {parts}; server CPU {1000 * cpu[k] / calls[k]:.2f} ms per call")
        for m, _ in modes:
            print(f"  this / compare, {m}: p50 x{statistics.median(lat[0][m]) / statistics.median(lat[1][m]):.3f}")
        print(f"  CPU per call x{(cpu[0] / calls[0]) / (cpu[1] / calls[1]):.3f}; answers that differ: {mismatches}")


if __name__ == "__main__":
    p = command_line(__doc__, seed=7, turns=1000, questions=200, seats=50, per_seat=200, windows=6, calls=60)
    p.add_argument("other", help="the other checkout")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    parsed = p.parse_args()
    parsed.other = os.path.abspath(parsed.other)
    asyncio.run(main(parsed))
