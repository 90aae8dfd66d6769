"""Embedders for tests that wrap a real one (the local model, the scripted endpoint) to watch or
break it: a subclass overrides what it watches and delegates the rest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DelegatingEmbedder"]


class DelegatingEmbedder:
    """Every embedder method passed through to ``inner``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.model = inner.model

    @property
    def dimensions(self) -> int | None:
        return self._inner.dimensions

    def split(self, text: str) -> list[str]:
        return self._inner.split(text)

    async def split_async(self, text: str) -> list[str]:
        return await self._inner.split_async(text)

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        return await self._inner.embed_pieces(pieces)

    async def embed(self, texts: Sequence[str]) -> list[Any]:
        return await self._inner.embed(texts)
