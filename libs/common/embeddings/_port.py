from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vector:
    """A unit vector and the model it came from."""

    values: np.ndarray
    model: str

    @property
    def dimensions(self) -> int:
        return int(self.values.shape[0])

    def tolist(self) -> list[float]:
        values: list[float] = self.values.astype(np.float32).tolist()
        return values


class EmbeddingError(Exception):
    """An embeddings request that did not produce vectors. ``kind`` is machine-readable."""

    kind = "error"

    @property
    def about_input(self) -> bool:
        """True when the provider refused what was sent (the fill isolates such texts)."""
        return False


class EmbeddingRateLimited(EmbeddingError):
    kind = "rate_limited"


class EmbeddingTimeout(EmbeddingError):
    kind = "timeout"


class EmbeddingUnavailable(EmbeddingError):
    """5xx, network failure: may answer if called again."""

    kind = "unavailable"


class EmbeddingRefused(EmbeddingError):
    """The provider refused this request (400/422): the input, or a configuration it dislikes."""

    kind = "refused"

    @property
    def about_input(self) -> bool:
        return True


class EmbeddingConfigurationError(EmbeddingError):
    """A refused key, a model the endpoint does not serve, a width the store was not sized for, a
    local model that cannot be loaded."""

    kind = "configuration"


class Embedder(Protocol):
    model: str

    @property
    def dimensions(self) -> int | None: ...

    def split(self, text: str) -> list[str]:
        """The pieces of ``text`` that each fit the model's input, split between words."""
        ...

    async def split_async(self, text: str) -> list[str]:
        """:meth:`split` on the embedder's own threads (tokenising a long text on the event loop
        would stall every call the process serves)."""
        ...

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        """One request: a raw vector per piece. Raises :class:`EmbeddingError`."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[Vector | None]:
        """One request for all pieces of all texts; ``None`` where a vector has no direction."""
        ...


def _split_all(embedder: Embedder, texts: list[str]) -> list[list[str]]:
    return [embedder.split(text) or [text] for text in texts]


def usable(values: np.ndarray) -> bool:
    """A vector any recall could return: finite and not all zeros."""
    return bool(values.size) and bool(np.all(np.isfinite(values))) and float(np.abs(values).max()) > 0.0


def pool(pieces: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray | None:
    """Pool piece vectors into one unit vector (mean weighted by piece length), or ``None``.

    Weighting by length keeps a short tail piece from counting as much as a full one. A piece
    with no direction poisons the pool: the text's vector is then none, not a partial one.
    """
    if not pieces or any(not usable(p) for p in pieces):
        return None
    w = np.asarray(weights if weights is not None else [1.0] * len(pieces), dtype=np.float64)
    stacked = np.stack([p.astype(np.float64) / np.linalg.norm(p) for p in pieces])
    mean = (stacked * w[:, None]).sum(axis=0) / w.sum()
    norm = float(np.linalg.norm(mean))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    pooled: np.ndarray = (mean / norm).astype(np.float32)
    return pooled


Offload = Callable[..., Awaitable[Any]]
"""Runs a function on an embedder's worker threads: ``await offload(fn, *args)``."""


_T = TypeVar("_T")


class OwnThreads:
    """An embedder's own worker threads, not the loop's default executor: ``close`` drops the jobs
    not yet started (a stopping process does not wait on them; ``asyncio.run``'s exit would not).
    Sync work (tokenising, a model run) goes there, never on the event loop."""

    def __init__(self, workers: int, prefix: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
        self._closed = False

    def split(self, text: str) -> list[str]:
        """The pieces of ``text`` that each fit the model's input (the embedder's own rule)."""
        raise NotImplementedError

    async def offload(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` on the embedder's threads (cancelled with its caller if not started)."""
        if self._closed:
            raise EmbeddingUnavailable("the embedder is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def split_async(self, text: str) -> list[str]:
        """:meth:`split` on the embedder's threads: tokenising a long text never blocks the loop."""
        return await self.offload(self.split, text)

    def _stop_threads(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)


async def embed_texts(embedder: Embedder, texts: Sequence[str], offload: Offload) -> list[Vector | None]:
    """Split every text (on the embedder's threads: tokenising a long text would stall every call
    this process serves), send all pieces in one request, pool each text's pieces."""
    splits = await offload(_split_all, embedder, list(texts))
    spans: list[tuple[int, int]] = []
    pieces: list[str] = []
    for parts in splits:
        spans.append((len(pieces), len(pieces) + len(parts)))
        pieces.extend(parts)
    raw = await embedder.embed_pieces(pieces)
    out: list[Vector | None] = []
    for start, end in spans:
        pooled = pool(raw[start:end], [len(p) for p in pieces[start:end]])
        out.append(None if pooled is None else Vector(pooled, embedder.model))
    return out


async def embed_query(embedder: Embedder, text: str) -> Vector | None:
    """One query text's vector, through the embedder's query-vector cache when it has one (a hit
    returns the very vector the first embed of (model, text) produced); otherwise :meth:`embed`.
    Raises :class:`EmbeddingError` as :meth:`embed` does — any other exception of the embedder too
    (kind ``error``, logged with its traceback): its callers read only the port's family, so an
    adapter's bug costs a search its vector half, never the call. A vector with no direction is
    not kept."""
    cache = getattr(embedder, "query_cache", None)
    if cache is not None:
        hit = cache.get(embedder.model, text)
        if hit is not None:
            return Vector(hit, embedder.model)
    try:
        [vec] = await embedder.embed([text])
    except (EmbeddingError, TimeoutError):
        raise
    except Exception as exc:
        _log.exception("embedder %s raised outside the port's errors", embedder.model)
        raise EmbeddingError(f"the embedder failed: {type(exc).__name__}: {exc}") from exc
    if vec is not None and cache is not None:
        vec = Vector(cache.put(embedder.model, text, vec.values), vec.model)
    return vec


async def embed_within(
    embedder: Embedder | None, text: str, budget: float, *, query: bool = False
) -> tuple[Vector | None, str | None]:
    """One text under a deadline (a write's or a turn's two seconds): its vector, or none and why —
    ``unconfigured``, ``timeout``, the provider error's kind, or ``unusable_vector`` (no direction).
    ``query=True`` (a search's query, never a stored row's text) goes through the query cache.
    Never raises for the embedder: any other exception of it is none with ``error`` (logged with
    its traceback), because a row whose vector cannot be had is stored without one, never refused."""
    if embedder is None:
        return None, "unconfigured"
    try:
        async with asyncio.timeout(budget):
            if query:
                vec = await embed_query(embedder, text)
            else:
                [vec] = await embedder.embed([text])
    except TimeoutError:
        return None, "timeout"
    except EmbeddingError as err:
        return None, err.kind
    except Exception:
        _log.exception("embedder %s raised outside the port's errors", embedder.model)
        return None, EmbeddingError.kind
    if vec is None:
        return None, "unusable_vector"
    return vec, None
