"""Where the samples of a py-spy flame graph go: the stacks rebuilt from the SVG, then grouped.

    .venv/bin/python bench/experiments/flamesummary.py docs/perf/before-prefetch.svg [--top 25]

py-spy's SVG (inferno) gives every frame its first sample (``fg:x``), its sample count (``fg:w``)
and its depth (``y``); that is enough to rebuild each distinct stack and its samples exactly. Then:

- categories: a sample counts in a category when ANY frame of its stack matches the category's
  pattern (inclusive share; categories overlap, e.g. an SQL span's work is inside a handler);
- exclusive buckets: each sample goes to the FIRST bucket (in the order listed) one of whose
  patterns matches any frame of its stack, so the buckets add up to 100%;
- the top self frames (the leaf of each stack).

With ``--native`` py-spy cannot always tell a thread that waits from one that works: a pool
worker blocked in ``queue.get`` (a futex in libc) or the event loop in ``epoll_wait`` is sampled
as if running. Such stacks are counted apart as "idle" and every share below is of the BUSY samples
(the rest), which is the CPU the process spent.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(
    r'<g><title>(?P<title>[^<]*)</title><rect x="[^"]*" y="(?P<y>[\d.]+)"[^>]*fg:x="(?P<x>\d+)" fg:w="(?P<w>\d+)"'
)


def stacks(svg: str) -> tuple[list[tuple[tuple[str, ...], int]], int]:
    """[(stack root..leaf, samples)] and the total samples."""
    frames = []
    for m in _FRAME.finditer(svg):
        title = html.unescape(m["title"])
        name = re.sub(r" \([\d,]+ samples?, [\d.]+%\)$", "", title)
        frames.append((float(m["y"]), int(m["x"]), int(m["w"]), name))
    if not frames:
        raise SystemExit("no frames found (not a py-spy flame graph?)")
    ys = sorted({f[0] for f in frames})
    # The root row is the one whose frames cover the most samples; depth grows away from it.
    widest = max(ys, key=lambda y: sum(f[2] for f in frames if f[0] == y))
    if widest == ys[-1]:
        ys = ys[::-1]
    depth = {y: i for i, y in enumerate(ys)}
    by_depth: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for y, x, w, name in frames:
        by_depth[depth[y]].append((x, w, name))
    for d in by_depth:
        by_depth[d].sort()
    total = sum(w for _, w, _ in by_depth[0])

    # Self samples of a frame = its width minus its children's widths; each frame's stack = the
    # chain of frames containing it at lower depths.
    out: list[tuple[tuple[str, ...], int]] = []

    def walk(d: int, lo: int, hi: int, prefix: tuple[str, ...]) -> None:
        row = by_depth.get(d, [])
        # frames of this row inside [lo, hi)
        import bisect

        i = bisect.bisect_left(row, (lo, -1, ""))
        while i < len(row) and row[i][0] < hi:
            x, w, name = row[i]
            stack = (*prefix, name)
            child_w = 0
            nxt = by_depth.get(d + 1, [])
            j = bisect.bisect_left(nxt, (x, -1, ""))
            while j < len(nxt) and nxt[j][0] < x + w:
                child_w += nxt[j][1]
                j += 1
            if w - child_w > 0:
                out.append((stack, w - child_w))
            if child_w:
                walk(d + 1, x, x + w, stack)
            i += 1

    sys.setrecursionlimit(10000)
    walk(0, 0, total, ())
    return out, total


# One row per service package, the same in every table below that names them.
_SERVICES: list[tuple[str, str]] = [
    (f"services/{name}", rf"services/{name}/")
    for name in ("prefetch", "diary", "episodes", "skills", "profiles", "reflector")
]


# What the issue suspects, and what else a turn's time goes to. Patterns match py-spy frame names
# ("function (path/file.py:line)"; native frames "symbol (library.so)" with --native).
CATEGORIES: list[tuple[str, str]] = [
    ("OpenTelemetry (spans, context, instrumentation)", r"opentelemetry"),
    ("  SQL statement spans (db.py TracedConnection._traced)", r"_traced \(.*libs/common/db\.py"),
    (
        "  the gRPC server span interceptor (otel aio_server_interceptor)",
        r"opentelemetry/instrumentation/grpc/_aio_server",
    ),
    ("  the gRPC client span interceptor (otel aio client)", r"opentelemetry/instrumentation/grpc/_aio_client"),
    (
        "our server interceptors (grpcserver.py wrappers + contract + auth)",
        r"libs/common/(grpcserver|contract|auth)\.py",
    ),
    ("  contract check (contract.check_request)", r"check_request \(.*contract\.py|libs/common/contract\.py"),
    ("  auth (AuthInterceptor / Authenticator)", r"libs/common/auth\.py|AuthInterceptor"),
    ("  CallTracker + rpc duration metric", r"_record_rpc|CallTracker"),
    ("  LoadShedder", r"admitted \(.*grpcserver"),
    ("metrics (OpenTelemetry metrics SDK record/add)", r"opentelemetry/sdk/metrics"),
    ("gRPC python layer (grpc/aio, cygrpc)", r"grpc/aio/|grpc/_cython|cygrpc|_server\.py.*grpc|grpc_core|libgrpc"),
    ("protobuf (de)serialisation and message building", r"google/protobuf|_message\.|upb_|protobuf"),
    ("asyncpg (driver, codecs, pool)", r"asyncpg"),
    ("embedding model (onnxruntime run)", r"onnxruntime|libonnxruntime|InferenceSession|Ort"),
    ("embedding tokeniser", r"tokenizers|Tokenizer|encode_batch"),
    ("libs/common/embeddings (python side)", r"libs/common/embeddings/"),
    ("vector index (qdrant edge / client)", r"qdrant|vectorindex"),
    ("asyncio event loop machinery (select, run_once, callbacks)", r"asyncio/|uvloop|_run_once|select \(|epoll"),
    ("the offline aux model + prompts (auxmodel)", r"libs/common/auxmodel"),
    *_SERVICES,
    ("numpy", r"numpy"),
    ("logging", r"logging/__init__"),
    ("importing (import machinery)", r"_find_and_load|<frozen importlib"),
]

# Exclusive buckets: first match wins (deeper, more specific work first).
BUCKETS: list[tuple[str, str]] = [
    ("import machinery (a module imported at run time)", r"_find_and_load|<frozen importlib"),
    ("embedding model run (onnxruntime)", r"onnxruntime|libonnxruntime|InferenceSession"),
    ("embedding tokenise/split/pool (python + tokenizers)", r"tokenizers|libs/common/embeddings/"),
    (
        "OpenTelemetry tracing (spans, propagation, SQL spans)",
        r"opentelemetry/(sdk/trace|trace|context|propagat|instrumentation)|_traced \(.*libs/common/db\.py",
    ),
    ("OpenTelemetry metrics", r"opentelemetry/sdk/metrics|opentelemetry/metrics"),
    ("request contract check", r"libs/common/contract\.py"),
    ("auth", r"libs/common/auth\.py"),
    ("asyncpg", r"asyncpg"),
    ("vector index (qdrant)", r"qdrant|vectorindex"),
    ("protobuf", r"google/protobuf|upb_|protobuf"),
    ("offline aux model + prompt build", r"libs/common/auxmodel|services/prefetch/text\.py"),
    ("gRPC (python aio layer + core)", r"grpc/aio/|grpc/_cython|cygrpc|grpc_core|libgrpc|grpc/__init__|channels\.py"),
    ("asyncio loop machinery", r"asyncio/|_run_once|epoll|select \("),
]


_IDLE = re.compile(
    r"^(epoll_wait|_queue_SimpleQueue_get|PyThread_acquire_lock_timed|pthread_cond_(timed)?wait|sem_(timed)?wait"
    r"|lock_PyThread_acquire_lock|acquire_timed|select \(|poll \(|Condition\.wait|Event\.wait"
    r"|Thread\._wait_for_tstate_lock|sleep \()"
)


def busy(data: list[tuple[tuple[str, ...], int]]) -> tuple[list[tuple[tuple[str, ...], int]], int]:
    """The stacks that are not a thread waiting (see the module docstring), and the idle count."""
    keep, idle = [], 0
    for st, w in data:
        if any(_IDLE.match(f) for f in st[-8:]):
            idle += w
        else:
            keep.append((st, w))
    return keep, idle


# Deepest owner: each sample goes to the frame nearest its leaf that matches one of these (in this
# order of precedence per frame); C frames below Python (send, malloc) count for the Python code that
# called them. Interceptor wrappers are on every handler's stack, so only this view says what they
# cost themselves.
OWNERS: list[tuple[str, str]] = [
    ("Python cyclic GC", r"^gc_collect|^collect_with_callback|^gc_collect_main"),
    ("ONNX model run", r"onnxruntime"),
    ("tokenizer (tokenizers)", r"tokenizers"),
    ("embedder, python side (libs/common/embeddings)", r"libs/common/embeddings/"),
    ("OpenTelemetry (tracing + metrics SDK, instrumentation)", r"opentelemetry"),
    ("db.py TracedConnection (span wrapper per statement)", r"libs/common/db\.py"),
    ("asyncpg", r"asyncpg"),
    ("qdrant (vector index)", r"qdrant"),
    ("protobuf", r"google/protobuf|google/_upb|upb_|PyUpb"),
    ("contract check (libs/common/contract.py)", r"libs/common/contract\.py"),
    ("auth (libs/common/auth.py)", r"libs/common/auth\.py"),
    ("server interceptors (libs/common/grpcserver.py)", r"libs/common/grpcserver\.py"),
    ("client identity interceptor (libs/common/channels.py)", r"libs/common/channels\.py"),
    ("events (libs/common/events.py)", r"libs/common/events\.py"),
    ("jobs queue (libs/common/jobs.py)", r"libs/common/jobs\.py"),
    ("auxiliary model (libs/common/auxmodel)", r"libs/common/auxmodel"),
    ("other libs/common", r"libs/common/"),
    *_SERVICES,
    ("other services/", r"services/"),
    ("bench harness", r"bench/"),
    ("gRPC (python aio layer + core)", r"grpc"),
    ("numpy", r"numpy"),
    ("asyncio loop", r"asyncio|_asynciomodule|selectors\.py|base_events"),
    ("import machinery", r"importlib"),
]


_WEAK = {"asyncio loop", "import machinery", "bench harness"}


def owners(data: list[tuple[tuple[str, ...], int]]) -> Counter[str]:
    """An asyncio frame is a weak owner: a transport's ``write`` called by asyncpg is asyncpg's I/O,
    so a strong owner up to 6 frames above it takes the sample instead."""
    compiled = [(name, re.compile(p)) for name, p in OWNERS]
    counts: Counter[str] = Counter()
    for st, w in data:
        weak, weak_at, owner = None, 0, None
        for depth, frame in enumerate(reversed(st)):
            hit = next((name for name, rx in compiled if rx.search(frame)), None)
            if hit is None:
                continue
            if hit in _WEAK:
                if weak is None:
                    weak, weak_at = hit, depth
                continue
            if weak is None or depth - weak_at <= 6:
                owner = hit
            break
        counts[owner or weak or "other (python stdlib, unattributed C)"] += w
    return counts


def summarize(path: Path, top: int) -> str:
    data, total = stacks(path.read_text())
    data, idle = busy(data)
    lines = [f"{path}: {total} samples, {idle} of them a thread waiting (idle), {total - idle} busy"]
    total -= idle
    lines.append(
        "\ninclusive share by category (a sample counts where any frame of its stack matches; a wrapper such"
        "\nas an interceptor counts the work of everything it wraps: see 'deepest owner' for its own cost):"
    )
    for name, pat in CATEGORIES:
        rx = re.compile(pat)
        n = sum(w for st, w in data if any(rx.search(f) for f in st))
        lines.append(f"  {100 * n / total:6.1f}%  {name}")
    lines.append("\nexclusive buckets (first match in this order; the rest is 'other python'):")
    counts: Counter[str] = Counter()
    compiled = [(name, re.compile(p)) for name, p in BUCKETS]
    for st, w in data:
        for name, rx in compiled:
            if any(rx.search(f) for f in st):
                counts[name] += w
                break
        else:
            counts["other (python: handlers, services, libs)"] += w
    for name, _ in [*BUCKETS, ("other (python: handlers, services, libs)", "")]:
        lines.append(f"  {100 * counts[name] / total:6.1f}%  {name}")
    lines.append("\ndeepest owner (each sample to the owner nearest its leaf; adds up to 100%):")
    for name, n in owners(data).most_common():
        lines.append(f"  {100 * n / total:6.1f}%  {name}")
    lines.append(f"\ntop {top} self frames (leaf of the stack):")
    leaf: Counter[str] = Counter()
    for st, w in data:
        leaf[st[-1]] += w
    for name, w in leaf.most_common(top):
        lines.append(f"  {100 * w / total:6.1f}%  {name[:150]}")
    return "\n".join(lines)


def grep(path: Path, pattern: str) -> str:
    data, total = stacks(path.read_text())
    data, idle = busy(data)
    total -= idle
    rx = re.compile(pattern)
    n = sum(w for st, w in data if any(rx.search(f) for f in st))
    return f"{100 * n / total:.1f}% of {total} busy samples have a frame matching {pattern!r}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("svg", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--grep", help="only: the inclusive share of samples matching this regex")
    a = ap.parse_args()
    print(grep(a.svg, a.grep) if a.grep else summarize(a.svg, a.top))
