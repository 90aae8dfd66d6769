"""The embeddings seam: the local model offline, the OpenAI-compatible adapter over HTTP, long
texts split between words and pooled, direction-less vectors counted as none."""

from __future__ import annotations

import numpy as np
import pytest

from libs.common.config import EmbeddingsConfig
from libs.common.embeddings import (
    EmbeddingConfigurationError,
    EmbeddingError,
    EmbeddingRateLimited,
    EmbeddingRefused,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    embed_query,
    embed_within,
    pool,
    split_between_words,
    usable,
)
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from tests.support.embedders import DelegatingEmbedder, unloadable_local_embedder
from tests.support.scripted_openai import Reply


async def test_local_model_runs_offline_and_tags_model_and_width(local_embedder):
    a, b, c = await local_embedder.embed(
        ["Bob prefers weekly status digests", "Bob wants a summary once a week", "The kafka consumer is flaky"]
    )
    assert (a.model, a.dimensions) == ("all-MiniLM-L6-v2", 384)
    assert np.linalg.norm(a.values) == pytest.approx(1.0, abs=1e-4)
    assert float(a.values @ b.values) > float(a.values @ c.values) + 0.2


def test_the_shipped_tokenizer_is_the_models_own():
    """The tokenizer ships in the repository (libs/common/embeddings/data, Apache-2.0), not in a
    package imported only to find it; its digest is pinned so a changed file is a decision."""
    import hashlib

    from libs.common.embeddings.local_onnx import _tokenizer_path

    digest = hashlib.sha256(_tokenizer_path().read_bytes()).hexdigest()
    assert digest == "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


async def test_local_long_text_is_split_between_words_and_pooled(local_embedder):
    words = [f"word{i}" for i in range(600)]
    text = " ".join(words)
    pieces = local_embedder.split(text)
    assert len(pieces) > 1
    assert " ".join(pieces).split() == words  # split only between words, nothing lost
    for piece in pieces:
        assert local_embedder._token_costs([piece])[0] <= 254
    [whole] = await local_embedder.embed([text])
    parts = await local_embedder.embed_pieces(pieces)
    expected = pool(parts, [len(p) for p in pieces])
    assert np.allclose(whole.values, expected, atol=1e-5)


def test_an_overlong_word_is_cut_rather_than_dropped():
    pieces = split_between_words("a " + "x" * 50 + " b", lambda ws: [len(w) for w in ws], 10)
    assert "".join(p.replace(" ", "") for p in pieces) == "a" + "x" * 50 + "b"
    assert all(len(p) <= 10 for p in pieces)


def test_zero_and_non_finite_vectors_count_as_none():
    assert not usable(np.zeros(8, dtype=np.float32))
    assert not usable(np.array([1.0, float("nan")], dtype=np.float32))
    assert not usable(np.array([1.0, float("inf")], dtype=np.float32))
    assert usable(np.array([0.0, 1e-6], dtype=np.float32))
    assert pool([np.ones(4), np.zeros(4)]) is None  # one bad piece poisons the pool


@pytest.fixture
def remote(scripted_openai):
    embedder = OpenAICompatibleEmbedder(
        EmbeddingsConfig(
            kind="openai",
            base_url=scripted_openai.base_url,
            api_key="k",
            model="scripted-embed",
            timeout_seconds=0.5,
            max_input_tokens=20,
        )
    )
    yield embedder, scripted_openai


async def test_remote_vectors_come_back_in_order_with_their_model(remote):
    embedder, _ = remote
    a, b = await embedder.embed(["first text", "second text"])
    assert a.model == "scripted-embed" and a.dimensions == 64
    assert not np.allclose(a.values, b.values)
    await embedder._client.close()


async def test_remote_long_text_sends_all_its_pieces_in_one_request(remote):
    embedder, server = remote
    text = " ".join(f"token{i}" for i in range(40))  # 60-byte pieces at max_input_tokens 20
    [vec] = await embedder.embed([text])
    [body] = server.received("embeddings")
    assert len(body["input"]) > 1 and " ".join(body["input"]) == text
    assert vec is not None and np.linalg.norm(vec.values) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(status=429), EmbeddingRateLimited),
        (Reply(delay=1.5), EmbeddingTimeout),
        (Reply(status=500), EmbeddingUnavailable),
        (Reply(status=400), EmbeddingRefused),
        (Reply(status=401), EmbeddingConfigurationError),
        (Reply(status=404), EmbeddingConfigurationError),
        # A 200 whose body is no embeddings list is the server's bad answer, never another exception.
        (Reply(raw=b"<html>captive portal</html>", content_type="text/html"), EmbeddingUnavailable),
        (Reply(body={"object": "list"}), EmbeddingUnavailable),
        (Reply(body={"data": [{"index": 0, "embedding": None}]}), EmbeddingUnavailable),
        (Reply(body={"data": [{"index": 0, "embedding": [[1.0, 0.0]]}]}), EmbeddingUnavailable),
        (Reply(body={"data": [{"index": 0, "embedding": [1.0, "x"]}]}), EmbeddingUnavailable),
    ],
)
async def test_remote_failures_map_onto_the_seams_kinds(remote, reply, error):
    embedder, server = remote
    server.push("embeddings", reply)
    with pytest.raises(error):
        await embedder.embed(["x"])


async def test_an_answer_that_does_not_index_each_input_once_is_unavailable(remote):
    embedder, server = remote
    server.push(
        "embeddings", Reply(body={"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]})
    )
    with pytest.raises(EmbeddingUnavailable):
        await embedder.embed(["a", "b"])


async def test_a_local_model_that_cannot_load_is_a_configuration_error_on_every_path(monkeypatch, tmp_path):
    # The one-piece path (a model run), and a non-ASCII or long text, split (tokenised) first.
    embedder = unloadable_local_embedder(monkeypatch, tmp_path)
    for texts in (["short ascii"], ["the café team"], ["word " * 60]):
        with pytest.raises(EmbeddingConfigurationError, match="could not be loaded"):
            await embedder.embed(texts)
    with pytest.raises(EmbeddingConfigurationError):
        await embedder.split_async("the café team")
    assert embedder.loaded is False
    await embedder.close()


class _Buggy(DelegatingEmbedder):
    """An adapter with a bug: it raises outside the port's family."""

    async def embed(self, texts):  # type: ignore[no-untyped-def]
        raise KeyError("a bug in an adapter")


async def test_an_adapters_bug_costs_the_vector_never_the_call(local_embedder, caplog):
    buggy = _Buggy(local_embedder)
    assert await embed_within(buggy, "a note", 2.0) == (None, "error")
    assert await embed_within(buggy, "a query", 2.0, query=True) == (None, "error")
    with pytest.raises(EmbeddingError, match="KeyError"):
        await embed_query(buggy, "a query")
    # Logged with its traceback: a bug must be findable, not only counted.
    assert any(r.exc_info and isinstance(r.exc_info[1], KeyError) for r in caplog.records)


async def test_remote_direction_less_vectors_are_none(remote):
    embedder, server = remote
    server.push("embeddings", Reply(vectors=lambda inp: [[0.0] * 64, [float("nan")] * 64, [1.0] + [0.0] * 63]))
    zero, nan, ok = await embedder.embed(["a", "b", "c"])
    assert zero is None and nan is None and ok is not None


async def test_a_width_other_than_configured_is_a_configuration_error(scripted_openai):
    embedder = OpenAICompatibleEmbedder(
        EmbeddingsConfig(kind="openai", base_url=scripted_openai.base_url, api_key="k", model="m", dimensions=32)
    )
    scripted_openai.push("embeddings", Reply(vectors=lambda inp: [[1.0] * 16 for _ in inp]))
    with pytest.raises(EmbeddingConfigurationError):
        await embedder.embed(["x"])


async def test_concurrent_callers_share_a_model_run_and_each_gets_its_own_vectors(local_embedder):
    import asyncio

    texts = [f"note number {i} about topic {i % 3}" for i in range(12)] + [" ".join(["long"] * 600)]
    alone = [await local_embedder.embed([t]) for t in texts]
    together = await asyncio.gather(*(local_embedder.embed([t]) for t in texts))
    for (a,), (b,) in zip(alone, together, strict=True):
        assert np.allclose(a.values, b.values, atol=1e-5)
