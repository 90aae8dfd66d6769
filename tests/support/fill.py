"""The vector fill's test harness, shared by the diary's and the episodes' fill tests: rows are
written with no embedder (so they have no vector), then each ``minute`` is one run of the fill
passes against a scripted OpenAI-compatible embeddings endpoint over real HTTP."""

from __future__ import annotations

from typing import Any

from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from libs.common.events import read_events
from tests.support.app import open_app
from tests.support.scripted_openai import Reply, openai_provider

__all__ = ["FillMinutes", "inputs", "refusing"]


class FillMinutes:
    """Runs minutes of the fill; a subclass writes the rows and names the table it reads back
    (``ROWS_SQL``, whose rows land in ``self.rows`` by id after each minute)."""

    ROWS_SQL = ""

    def __init__(self, make_settings, dsn, clock, server, index):  # type: ignore[no-untyped-def]
        self.make_settings, self.dsn, self.clock, self.server, self.index = make_settings, dsn, clock, server, index

    def settings(self, **fill: Any) -> Any:
        """The service's settings for a minute, with ``fill``'s budgets."""
        raise NotImplementedError

    async def minute(self, settings: Any = None, **fill: Any) -> Any:
        """One minute of the fill; its report."""
        raise NotImplementedError

    def embeddings(self, model: str, dims: int | None, fill: dict[str, Any]) -> dict[str, Any]:
        """The scripted endpoint's embeddings provider; takes ``max_input_tokens`` out of ``fill``."""
        emb: dict[str, Any] = openai_provider(
            self.server, model, timeout_seconds=0.5, max_input_tokens=fill.pop("max_input_tokens", 256)
        )
        if dims:
            emb["dimensions"] = dims
        return emb

    async def run_passes(self, settings, names: list[str], passes: dict[str, str]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        """One minute: the pass of each of ``names`` run once with the configured embedder; the
        table and the events read back; the clock moved on to the next minute."""
        embedder = OpenAICompatibleEmbedder(settings.providers.embeddings)
        try:
            async with open_app(
                settings, self.dsn, names=names, clock=self.clock, embedder=embedder, index=self.index
            ) as app:
                self.app = app
                results = {n: await app.passes()[passes[n]].run() for n in names}
                self.rows = {str(r["id"]): r for r in await app.infra.pool.fetch(self.ROWS_SQL)}
                self.events = await read_events(app.infra.pool)
        finally:
            await embedder.close()
        self.clock.advance(seconds=61)  # the next call is the next minute
        return results

    def filled(self) -> set[str]:
        return {i for i, r in self.rows.items() if r["embedding_model"]}

    async def first_minute_refusing(self, word: str):  # type: ignore[no-untyped-def]
        """Pieces of 100 tokens, 1500 bytes a minute, and every request holding ``word`` refused:
        the refused chunk spends the first minute's bytes before its piece can be found, so that
        minute holds nothing back. The settings, for the minutes after."""
        settings = self.settings(company_bytes_per_minute=1500, max_input_tokens=100)
        self.server.rule("embeddings", refusing(word))
        first = await self.minute(settings)
        assert first.ended_by == "bytes" and first.refused_held == 0
        return settings

    async def first_minute_of_a_long_row(self):  # type: ignore[no-untyped-def]
        """Pieces of 100 tokens (300 bytes), 1500 bytes a minute: the one row, longer than that,
        goes partly in its first minute and is continued, not filled. The settings, the pieces
        sent, and the row's ``memory_fill_input_continued`` event."""
        settings = self.settings(company_bytes_per_minute=1500, max_input_tokens=100)
        first = await self.minute(settings)
        sent = [p for body in inputs(self.server) for p in body]
        assert first.ended_by == "bytes" and first.filled == 0 and first.continued == 1
        assert sum(len(p) for p in sent) <= 1500
        [cont] = self.events_of("memory_fill_input_continued")
        return settings, sent, cont

    async def next_minute(self, settings):  # type: ignore[no-untyped-def]
        """Another minute, the endpoint's record cleared first: its report and the pieces sent."""
        self.server.clear()
        report = await self.minute(settings)
        return report, [p for body in inputs(self.server) for p in body]

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events of ``kind`` read back after the last minute, oldest first."""
        return [e for e in self.events if e["kind"] == kind]


def refusing(word: str):  # type: ignore[no-untyped-def]
    """A scripted embeddings rule: a 400 for a request with an input holding ``word``."""
    return lambda body: Reply(status=400) if any(word in t for t in body["input"]) else None


def inputs(server) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """The inputs of every embeddings request the scripted server received, in order."""
    return [body["input"] for body in server.received("embeddings")]
