"""The embeddings seam: one port, a local model that runs offline, an OpenAI-compatible adapter.

A text longer than the model's input is split between words and its pieces' vectors pooled; a
vector with no direction (all zeros, or not finite) counts as none; every vector carries the model
and width it came from. Build one with :func:`build_embedder`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.common.embeddings._port import (
    Embedder,
    EmbeddingConfigurationError,
    EmbeddingError,
    EmbeddingRateLimited,
    EmbeddingRefused,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    Vector,
    embed_query,
    embed_within,
    pool,
    usable,
)
from libs.common.embeddings._split import split_between_words

if TYPE_CHECKING:  # only for the annotation: the seam need not load the config models
    from libs.common.config import EmbeddingsConfig

__all__ = [
    "Embedder",
    "EmbeddingConfigurationError",
    "EmbeddingError",
    "EmbeddingRateLimited",
    "EmbeddingRefused",
    "EmbeddingTimeout",
    "EmbeddingUnavailable",
    "Vector",
    "build_embedder",
    "embed_query",
    "embed_within",
    "pool",
    "split_between_words",
    "usable",
]


def build_embedder(config: EmbeddingsConfig) -> Embedder | None:
    """The configured embedder, or ``None`` when ``providers.embeddings.kind`` is ``none``."""
    if config.kind == "none":
        return None
    if config.kind == "local":
        from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

        # Built, not loaded: the model loads on the first embed (or the runner's warm-up of a
        # server whose requests embed), so a process that never embeds never pays for it.
        return LocalMiniLMEmbedder(
            model=config.model,
            max_input_tokens=config.max_input_tokens,
            model_runs=config.model_runs,
            batch_pieces=config.batch_pieces,
            batch=config.batch_max_texts,
            query_cache_entries=config.query_cache_entries,
        )
    # Imported only when configured: the OpenAI SDK is a quarter of a process's import time.
    from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder

    return OpenAICompatibleEmbedder(config)
