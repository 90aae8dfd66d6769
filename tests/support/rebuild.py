"""The index-rebuild check the diary and the episodes share: rows written through the scripted
embeddings endpoint into one index, then a brand-new, empty index rebuilt from Postgres alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from libs.common.config import Settings
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from tests.support.app import App, open_app
from tests.support.scripted_openai import ScriptedOpenAI

__all__ = ["rebuilt_index"]


@contextlib.asynccontextmanager
async def rebuilt_index(
    settings: Settings,
    dsn: str,
    clock: Any,
    server: ScriptedOpenAI,
    tmp_path: Path,
    service: str,
    write: Callable[[App], Awaitable[Any]],
) -> AsyncIterator[tuple[App, Any, int, Any]]:
    """``write(app)`` runs against a first edge index with the configured embedder; then ``service``
    rebuilds a second, empty one without one embedding call. Yields the app serving the rebuilt
    index, that index, how many rows the rebuild restored, and what ``write`` returned."""
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    embedder = OpenAICompatibleEmbedder(settings.providers.embeddings)
    first = QdrantEdgeIndex(tmp_path / "idx-a")
    async with open_app(settings, dsn, names=[service], clock=clock, embedder=embedder, index=first) as app:
        written = await write(app)
    await first.close()
    server.clear()
    # A brand-new, empty index: rebuild it from Postgres alone.
    second = QdrantEdgeIndex(tmp_path / "idx-b")
    async with open_app(settings, dsn, names=[service], clock=clock, embedder=embedder, index=second) as app:
        restored = await app.components[service].rebuild_index()
        assert server.received("embeddings") == []  # not one embedding call
        yield app, second, restored, written
    await second.close()
    await embedder.close()
