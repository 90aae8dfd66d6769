"""The embeddings seam: one port, a local model that runs offline, an OpenAI-compatible adapter.

A text longer than the model's input is split between words and its pieces' vectors pooled; a
vector with no direction (all zeros, or not finite) counts as none; every vector carries the model
and width it came from. Build one with :func:`build_embedder`.
"""

from libs.common.embeddings._port import (
    Embedder,
    EmbeddingConfigurationError,
    EmbeddingError,
    EmbeddingRateLimited,
    EmbeddingRefused,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    Vector,
    embed_within,
    pool,
    usable,
)
from libs.common.embeddings._split import split_between_words

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
    "embed_within",
    "pool",
    "split_between_words",
    "usable",
]


def build_embedder(config):  # type: ignore[no-untyped-def]
    """The configured embedder, or ``None`` when ``providers.embeddings.kind`` is ``none``."""
    if config.kind == "none":
        return None
    if config.kind == "local":
        from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

        return LocalMiniLMEmbedder(model=config.model, max_input_tokens=config.max_input_tokens)
    from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder

    return OpenAICompatibleEmbedder(config)
