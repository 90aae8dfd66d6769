"""A deterministic hashing embedder for the unit tier: no model, no network.

Each lowercased word is hashed (blake2b, so the same word maps to the same slots in every process)
to a few signed slots of a fixed-width vector; a text's vector is the normalised sum. Texts sharing
words are similar, texts sharing none are near orthogonal — enough to tell a use case's vector half
from its lexical and recency halves, never a stand-in for the real model's meaning.

``failure`` makes every call raise (an outage, a refused key); ``calls`` counts the texts embedded.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from libs.common.embeddings import EmbeddingError, Vector

__all__ = ["HashingEmbedder", "hash_vector"]

_WORD = re.compile(r"[a-z0-9]+")


def hash_vector(text: str, dims: int = 64) -> np.ndarray:
    """The unnormalised hashed bag of words of ``text``."""
    out = np.zeros(dims, dtype=np.float32)
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        for k in range(2):
            slot = int.from_bytes(digest[4 * k : 4 * k + 3], "little") % dims
            out[slot] += 1.0 if digest[4 * k + 3] & 1 else -1.0
    return out


class HashingEmbedder:
    def __init__(self, model: str = "hash-64", dims: int = 64):
        self.model = model
        self._dims = dims
        self.failure: EmbeddingError | None = None
        self.calls = 0

    @property
    def dimensions(self) -> int | None:
        return self._dims

    def split(self, text: str) -> list[str]:
        return [text]

    async def split_async(self, text: str) -> list[str]:
        return [text]

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        if self.failure is not None:
            raise self.failure
        self.calls += len(pieces)
        return [hash_vector(p, self._dims) for p in pieces]

    async def embed(self, texts: Sequence[str]) -> list[Vector | None]:
        out: list[Vector | None] = []
        for raw in await self.embed_pieces(texts):
            norm = float(np.linalg.norm(raw))
            out.append(Vector((raw / norm).astype(np.float32), self.model) if norm > 0 else None)
        return out
