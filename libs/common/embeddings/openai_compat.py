"""Embeddings from any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LM Studio, ...).

No retries here: the callers own the policy (the inline write has a two-second budget, the fill
ends its minute on a rate limit). Every failure is mapped onto the seam's error kinds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import openai

from libs.common.config import EmbeddingsConfig
from libs.common.embeddings._cache import QueryCache
from libs.common.embeddings._port import (
    EmbeddingConfigurationError,
    EmbeddingError,
    EmbeddingRateLimited,
    EmbeddingRefused,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    OwnThreads,
    Vector,
    embed_texts,
)
from libs.common.embeddings._split import split_between_words
from libs.common.metrics import EMBED_BATCH, EMBED_DURATION

__all__ = ["OpenAICompatibleEmbedder", "map_openai_error"]

# Without the model's tokenizer a piece is priced in bytes: English runs near four bytes a token,
# so three bytes a token keeps a piece inside the input for all but the densest text.
_BYTES_PER_TOKEN = 3


def map_openai_error(exc: Exception) -> EmbeddingError:
    if isinstance(exc, openai.RateLimitError):
        return EmbeddingRateLimited(str(exc))
    if isinstance(exc, openai.APITimeoutError):
        return EmbeddingTimeout(str(exc))
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError | openai.NotFoundError):
        return EmbeddingConfigurationError(str(exc))
    if isinstance(exc, openai.BadRequestError | openai.UnprocessableEntityError):
        return EmbeddingRefused(str(exc))
    if isinstance(exc, openai.APIConnectionError | openai.InternalServerError):
        return EmbeddingUnavailable(str(exc))
    if isinstance(exc, openai.APIStatusError):
        return EmbeddingUnavailable(str(exc)) if exc.status_code >= 500 else EmbeddingRefused(str(exc))
    return EmbeddingUnavailable(str(exc))


def _vectors(resp: Any, count: int) -> list[np.ndarray]:
    """The answer's vectors in the order of the inputs. Anything else is the server's bad answer,
    raised as :class:`EmbeddingUnavailable` (it may answer properly if called again): a proxy's or
    captive portal's 200 HTML page (the client returns it as a string), an object without ``data``,
    indices that do not name each input once, a vector that is not a flat list of numbers. Never an
    exception outside the port's family: a caller that cannot read it would refuse the write."""
    try:
        data = list(resp.data)
        indices = [d.index for d in data]
        # A server that leaves every index out answers in input order; a partial set is no order.
        if any(i is not None for i in indices):
            data = [d for _, d in sorted(zip(indices, data, strict=True), key=lambda pair: pair[0])]
            indices = sorted(indices)
        else:
            indices = list(range(len(data)))
        vecs = [np.asarray(d.embedding, dtype=np.float32) for d in data]
    except Exception as exc:
        raise EmbeddingUnavailable(
            f"the endpoint answered something that is not a list of embeddings ({type(exc).__name__}: {exc})"
        ) from exc
    if len(vecs) != count:
        raise EmbeddingUnavailable(f"asked for {count} vectors, got {len(vecs)}")
    if indices != list(range(count)):
        raise EmbeddingUnavailable(f"the endpoint's answer does not index each of the {count} inputs once")
    if any(v.ndim != 1 for v in vecs):
        raise EmbeddingUnavailable("the endpoint answered a vector that is not a flat list of numbers")
    return vecs


class OpenAICompatibleEmbedder(OwnThreads):
    def __init__(self, config: EmbeddingsConfig):
        self.model = config.model
        self._config = config
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key.get_secret_value() if config.api_key else "unset",
            max_retries=0,
            timeout=config.timeout_seconds,
        )
        # Splitting a long text is CPU work: one thread of its own, never the event loop.
        super().__init__(1, "embedder-split")
        self.query_cache = QueryCache(config.query_cache_entries) if config.query_cache_entries else None

    @property
    def dimensions(self) -> int | None:
        return self._config.dimensions

    def split(self, text: str) -> list[str]:
        return split_between_words(
            text, lambda words: [len(w.encode()) for w in words], self._config.max_input_tokens * _BYTES_PER_TOKEN
        )

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        if not pieces:
            return []
        # omit leaves the field out of the request, as an absent keyword did.
        dimensions: int | openai.Omit = self._config.dimensions if self._config.dimensions else openai.omit
        started = time.perf_counter()
        try:
            resp = await self._client.embeddings.create(
                model=self.model, input=list(pieces), encoding_format="float", dimensions=dimensions
            )
        except Exception as exc:
            raise map_openai_error(exc) from exc
        # One request is this provider's model run.
        EMBED_DURATION.record(time.perf_counter() - started, {"agentlearn.model": self.model})
        EMBED_BATCH.record(len(pieces), {"agentlearn.model": self.model})
        vecs = _vectors(resp, len(pieces))
        if self._config.dimensions and any(v.shape[0] != self._config.dimensions for v in vecs):
            raise EmbeddingConfigurationError(
                f"the endpoint answered width {vecs[0].shape[0]}, configured {self._config.dimensions}"
            )
        return vecs

    async def embed(self, texts: Sequence[str]) -> list[Vector | None]:
        return await embed_texts(self, texts, self.offload)

    async def close(self) -> None:
        self._stop_threads()
        await self._client.close()
