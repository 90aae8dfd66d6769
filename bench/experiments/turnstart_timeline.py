"""The timeline of a rich BuildTurnContext: when each block, internal hop and SQL statement starts
and ends, in ms from the start of the turn start's own ``prefetch`` span (medians over the calls),
every SQL statement a span. What is on the critical path, and what waits for what.

    PYTHONPATH=<tree>:<tree>/libs/common/gen .venv/bin/python bench/experiments/turnstart_timeline.py \
        [--seats 10] [--calls 60] [--probe] [--slowest N]

Loaded as ``bench prefetch`` loads (its own loader and knowledge pages, the local MiniLM as the
bench builds it, the offline auxiliary provider), one caller, in one process; run it with another
tree's PYTHONPATH to see that tree's timeline (the script itself only reads spans).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import warnings
from collections import defaultdict

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

import numpy as np  # noqa: E402

from bench import harness  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
    from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kn_grpc
    from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc
    from libs.common import db, telemetry
    from libs.common.clock import ManualClock
    from libs.common.config import load_settings
    from services.runner.registry import SERVICES, migrations_of

    if args.probe:
        probe()
    pf = harness.script("prefetch")
    embedder = harness.loaded_minilm()
    clock = ManualClock()
    with harness.scratch_postgres("turnstart-timeline-") as (tmp, server):
        roles = {pf.ROLE: {"knowledge_containers": ["eng"], "unit": "platform"}}
        settings = load_settings(
            None, {"data_dir": str(tmp / "data"), "companies": {pf.COMPANY: {"roles": roles}}}, env={}
        )
        exporter = InMemorySpanExporter()
        telemetry.configure_tracing(settings.telemetry, extra_processors=[SimpleSpanProcessor(exporter)])
        async with contextlib.AsyncExitStack() as stack:
            infra, _ = await harness.open_edge_infra(
                stack, tmp, server.get_uri(), migrations_of(pf.NAMES), settings,
                clock=clock, embedder=embedder, pool_size=10,
            )  # fmt: skip
            components = [SERVICES[n].component(infra) for n in pf.NAMES]
            registrations = [r for c in components for r in c.registrations]
            channel, _ = await harness.serve_loopback(stack, registrations, infra.channels, pf.NAMES)
            stub = pb_grpc.PrefetchServiceStub(channel)
            corpus = pf.Corpus(300, random.Random(11))
            await corpus.embed(embedder)
            pages = kn_grpc.KnowledgeServiceStub(channel)
            for i, topic in enumerate(pf.TOPICS * 3 + pf.TOPICS[:4]):
                await pages.UpsertPage(
                    kn_pb.UpsertPageRequest(
                        company=pf.COMPANY,
                        container="eng",
                        title=f"Runbook {i}: {topic}",
                        body=f"How to {topic}. " * 20,
                    )
                )
            sizes = argparse.Namespace(notes=500, episodes=500, skills=20, sigma=0.15)
            await pf.load_seats(infra, clock, corpus, range(args.seats), sizes, np.random.default_rng(11))
            prng = random.Random(5)
            plan = [
                (prng.randrange(args.seats), pf.ASKS[i % len(pf.ASKS)].format(t=prng.choice(pf.TOPICS)))
                for i in range(args.calls + 10)
            ]
            for i, (s, ask) in enumerate(plan[:10]):  # warm-up
                await stub.BuildTurnContext(pf.ab_request(-i - 1, s, ask, "timeline"))
            db.configure_sql_spans("all")
            exporter.clear()
            for i, (s, ask) in enumerate(plan[10:]):
                await stub.BuildTurnContext(pf.ab_request(i, s, ask, "timeline"))
            spans = exporter.get_finished_spans()
    print_timeline(spans, args.calls, args.slowest)


PROBES = [
    ("services.prefetch.turn_context", "TurnContextBuilder", "_embed"),
    ("services.prefetch.turn_context", "TurnContextBuilder", "_settle"),
    ("services.prefetch.memory", None, "select_notes"),
    ("services.prefetch.past_turns", "PastTurns", "render"),
    ("services.prefetch.knowledge_block", None, "write_query"),
    ("services.prefetch.store", "PostgresPrefetchStore", "save_context"),
    ("libs.common.events", "Bookkeeping", "ctes"),
    ("services.prefetch.domain", "TurnContext", "to_json"),
]


def probe() -> None:
    """``--probe``: each function of :data:`PROBES` (module, class or None, name) wrapped in a span
    of its own name, so the timeline shows where the turn start's own steps fall (this process only)."""
    import functools
    import importlib
    import inspect

    from opentelemetry import trace

    tracer = trace.get_tracer("turnstart-timeline")
    for module, cls, name in PROBES:
        try:
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        label = f"probe {cls + '.' if cls else ''}{name}"
        if inspect.iscoroutinefunction(fn):

            async def wrapped(*a, __fn=fn, __label=label, **k):  # type: ignore[no-untyped-def]
                with tracer.start_as_current_span(__label):
                    return await __fn(*a, **k)
        else:

            def wrapped(*a, __fn=fn, __label=label, **k):  # type: ignore[no-untyped-def]
                with tracer.start_as_current_span(__label):
                    return __fn(*a, **k)

        setattr(owner, name, functools.wraps(fn)(wrapped))
        if cls is None:  # a module function: also where it was imported by name
            for user in ("services.prefetch.turn_context", "services.prefetch.builtins"):
                mod = importlib.import_module(user)
                if getattr(mod, name, None) is fn:
                    setattr(mod, name, getattr(owner, name))


def print_timeline(spans, calls: int, slowest: int = 0) -> None:  # type: ignore[no-untyped-def]
    by_trace = defaultdict(list)
    for s in spans:
        by_trace[s.context.trace_id].append(s)
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    calls_seen: list[tuple[float, dict[str, tuple[float, float]]]] = []  # (the call's ms, its spans)
    for trace_spans in by_trace.values():
        roots = [s for s in trace_spans if s.name == "prefetch"]
        if not roots:
            continue
        t0 = roots[0].start_time
        seen: dict[str, int] = defaultdict(int)
        one: dict[str, tuple[float, float]] = {}
        for s in sorted(trace_spans, key=lambda s: s.start_time):
            name = "sql " + s.name[3:] if s.name.startswith("db ") else s.name
            seen[name] += 1
            if seen[name] > 1:
                name = f"{name} #{seen[name]}"
            rows[name].append(((s.start_time - t0) / 1e6, (s.end_time - t0) / 1e6))
            one[name] = rows[name][-1]
        calls_seen.append(((roots[0].end_time - t0) / 1e6, one))
    print(f"rich BuildTurnContext, {calls} calls, one caller; ms from the start of the 'prefetch' span (medians)")
    print(f"{'span':<64} {'n/call':>6} {'start':>7} {'end':>7} {'dur':>7}")
    order = sorted(rows.items(), key=lambda kv: statistics.median(a for a, _ in kv[1]))
    for name, vals in order:
        start = statistics.median(a for a, _ in vals)
        end = statistics.median(b for _, b in vals)
        dur = statistics.median(b - a for a, b in vals)
        print(f"{name[:64]:<64} {len(vals) / calls:6.2f} {start:7.2f} {end:7.2f} {dur:7.2f}")
    if slowest:
        typical = {name: statistics.median(b - a for a, b in vals) for name, vals in rows.items()}
        total = statistics.median(ms for ms, _ in calls_seen)
        print(f"\nthe {slowest} slowest calls (median call {total:.1f} ms): the spans longest past their median")
        for ms, one in sorted(calls_seen, key=lambda c: c[0], reverse=True)[:slowest]:
            excess = sorted(((b - a - typical[n], n, a, b) for n, (a, b) in one.items()), reverse=True)[:6]
            print(f"  {ms:7.1f} ms: " + "; ".join(f"{n[:40]} +{x:.1f} ({a:.1f}-{b:.1f})" for x, n, a, b in excess))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seats", type=int, default=10)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--probe", action="store_true", help="spans around the turn start's own steps (PROBES)")
    ap.add_argument("--slowest", type=int, default=0, help="then the N slowest calls: which spans ran long")
    asyncio.run(main(ap.parse_args()))
    sys.exit(0)
