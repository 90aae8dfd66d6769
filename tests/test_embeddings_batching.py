"""How the local model runs what waits (docs/perf/analysis.md §2.3): one-thread, non-spinning ONNX
sessions, up to ``model_runs`` runs side by side, length-sorted micro-batches within a padded
word-piece budget; the query-vector cache; and the embedding metrics on the Prometheus exposition."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from libs.common.config import EmbeddingsConfig, TelemetryConfig
from libs.common.embeddings import build_embedder, embed_query, embed_within
from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder


class _Recording(LocalMiniLMEmbedder):
    """The real model, recording each model run's padded shape and how many ran at once."""

    def __init__(self, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.runs: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.active = 0
        self.most_at_once = 0
        self.both_in = threading.Event()

    def _model_run(self, enc):  # type: ignore[no-untyped-def]
        with self.lock:
            self.runs.append((len(enc), max(len(e.ids) for e in enc)))
            self.active += 1
            self.most_at_once = max(self.most_at_once, self.active)
            if self.active >= 2:
                self.both_in.set()
        try:
            # Hold the first run (up to a deadline) until a second one is in: if runs can go side
            # by side, one will; if they cannot, the deadline passes and the test sees 1.
            self.both_in.wait(5)
            return super()._model_run(enc)
        finally:
            with self.lock:
                self.active -= 1


TEXTS = [f"note {i}: " + " ".join(["the billing export failed again overnight"] * (1 + i % 7)) for i in range(24)]


async def test_the_session_runs_one_thread_without_spinning(local_embedder):
    options = local_embedder._session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


async def test_what_waits_runs_as_length_sorted_runs_within_the_padded_budget_side_by_side():
    embedder = _Recording(model_runs=2, batch_pieces=128, batch=32)
    embedder.load()
    single = LocalMiniLMEmbedder(batch_pieces=128)
    alone = [(await single.embed([t]))[0] for t in TEXTS[:3]]
    await single.close()
    together = await asyncio.gather(*(embedder.embed([t]) for t in TEXTS))
    # Every run's padded size (texts × the longest) is within the budget, and more than one text
    # shared a run: the waiting texts were batched, not run one by one or all padded together.
    assert all(n * width <= 128 or n == 1 for n, width in embedder.runs), embedder.runs
    assert sum(n for n, _ in embedder.runs) == len(TEXTS)
    assert any(n > 1 for n, _ in embedder.runs) and len(embedder.runs) > 1
    assert embedder.most_at_once == 2
    for a, (b,) in zip(alone, together[:3], strict=True):
        assert np.allclose(a.values, b.values, atol=1e-4)
    await embedder.close()


def test_micro_batches_are_sorted_and_a_text_over_the_budget_runs_alone():
    embedder = LocalMiniLMEmbedder(batch_pieces=100, batch=3)
    lengths = [50, 10, 200, 12, 11, 30, 13, 60]
    runs = embedder._micro_batches(lengths)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    flat = [lengths[i] for run in runs for i in run]
    assert flat == sorted(lengths)
    for run in runs:
        assert len(run) <= 3
        assert len(run) == 1 or len(run) * max(lengths[i] for i in run) <= 100
    assert [2] in runs  # 200 pieces: over the budget, alone


async def test_a_cached_query_vector_is_the_fresh_embed_and_the_cache_is_bounded_and_off_able():
    cached = LocalMiniLMEmbedder(query_cache_entries=2)
    fresh = LocalMiniLMEmbedder(query_cache_entries=0)
    ask = "could you rotate the staging database credentials before the release?"
    first = await embed_query(cached, ask)
    kept_after_first = len(cached.query_cache) if cached.query_cache else -1
    again = await embed_query(cached, ask)
    [reference] = await fresh.embed([ask])
    assert first is not None and again is not None and reference is not None
    assert np.array_equal(again.values, reference.values)  # bit for bit what a fresh embed gives
    assert again.model == reference.model == "all-MiniLM-L6-v2"
    assert cached.query_cache.hits == 1 and kept_after_first == 1
    with pytest.raises(ValueError):
        again.values[0] = 0.0  # a caller cannot change what the next caller reads
    # Bounded: two more queries evict the least recently used (the ask).
    await embed_query(cached, "who owns the kafka consumer?")
    await embed_query(cached, "when is the billing export due?")
    assert len(cached.query_cache) == 2 and cached.query_cache.get("all-MiniLM-L6-v2", ask) is None
    # Off: nothing is kept, every query is embedded.
    assert fresh.query_cache is None
    vec, reason = await embed_within(fresh, ask, 30.0, query=True)
    assert reason is None and np.array_equal(vec.values, reference.values)
    # A write (query=False) never enters the cache.
    await embed_within(cached, "a diary note's content", 30.0)
    assert cached.query_cache.get("all-MiniLM-L6-v2", "a diary note's content") is None
    await cached.close()
    await fresh.close()


def test_the_knobs_reach_the_local_embedder_and_it_is_built_unloaded():
    embedder = build_embedder(
        EmbeddingsConfig(model_runs=3, batch_pieces=512, batch_max_texts=8, query_cache_entries=10)
    )
    assert isinstance(embedder, LocalMiniLMEmbedder)
    assert (embedder._runs, embedder._budget, embedder._batch, embedder.query_cache.entries) == (3, 512, 8, 10)
    assert embedder.threads == 4
    assert not embedder.loaded
    assert build_embedder(EmbeddingsConfig(query_cache_entries=0)).query_cache is None


async def test_embedding_batch_size_and_duration_reach_the_prometheus_exposition():
    from prometheus_client import generate_latest

    from libs.common import telemetry

    telemetry.configure_metrics(TelemetryConfig())
    embedder = LocalMiniLMEmbedder()
    await embedder.embed(["one text", "and another one"])
    await embedder.close()
    lines = generate_latest().decode().splitlines()
    sizes = [x for x in lines if x.startswith("agentlearn_embedding_batch_size") and "_count" in x]
    durations = [x for x in lines if x.startswith("agentlearn_embedding_duration") and "_count" in x]
    assert any('agentlearn_model="all-MiniLM-L6-v2"' in x and float(x.split()[-1]) >= 1 for x in sizes), sizes
    assert any('agentlearn_model="all-MiniLM-L6-v2"' in x and float(x.split()[-1]) >= 1 for x in durations), durations
    sums = [x for x in lines if x.startswith("agentlearn_embedding_batch_size") and "_sum" in x]
    assert any(float(x.split()[-1]) >= 2 for x in sums), sums
