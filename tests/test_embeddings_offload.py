"""Nothing CPU-heavy on the event loop: the embedder tokenises and splits on its own threads, drops
the pieces of a caller that has gone, and a closed embedder leaves no queued work behind."""

from __future__ import annotations

import asyncio
import threading

import pytest

from libs.common.embeddings import EmbeddingUnavailable, embed_within
from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder


class _Observed(LocalMiniLMEmbedder):
    """The real local model, recording which thread split each text and which pieces it ran."""

    def __init__(self) -> None:
        # One run at a time: a second caller waits behind the held run instead of taking the
        # second slot, which is what these tests observe.
        super().__init__(model_runs=1)
        self.split_threads: list[int] = []
        self.ran: list[str] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def split(self, text: str) -> list[str]:
        self.split_threads.append(threading.get_ident())
        return super().split(text)

    def _run_batch(self, pieces: list[str]):  # type: ignore[no-untyped-def]
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        self.ran.extend(pieces)
        return super()._run_batch(pieces)


@pytest.fixture(scope="module")
def observed():
    embedder = _Observed()
    embedder.load()
    return embedder


async def test_a_long_text_is_split_off_the_event_loop(observed):
    observed.split_threads.clear()
    text = " ".join(f"word{i} of a long account of the billing export" for i in range(300))  # ~15 KB, a dozen pieces
    [vec] = await observed.embed([text])
    assert vec is not None and vec.dimensions == 384
    assert observed.split_threads and threading.get_ident() not in observed.split_threads


async def test_the_pieces_of_a_caller_whose_budget_expired_are_never_run(observed):
    observed.ran.clear()
    observed.entered.clear()
    observed.gate = threading.Event()  # holds the first batch inside the model
    try:
        first = asyncio.ensure_future(observed.embed_pieces(["the first caller's text"]))
        await asyncio.to_thread(observed.entered.wait, 30)  # the first batch is running
        late = asyncio.ensure_future(observed.embed_pieces(["the abandoned caller's text"]))
        kept = asyncio.ensure_future(observed.embed_pieces(["the patient caller's text"]))
        await asyncio.sleep(0)
        late.cancel()  # its budget ran out while it waited behind the first batch
        observed.gate.set()
        assert len(await first) == 1 and len(await kept) == 1
        assert late.cancelled()
    finally:
        observed.gate = None
    assert observed.ran == ["the first caller's text", "the patient caller's text"]
    # embed_within drops a caller the same way: the timeout cancels its wait, nothing is returned.
    vec, reason = await embed_within(observed, "fits easily", 30.0)
    assert vec is not None and reason is None


async def test_a_closed_embedder_cancels_its_queued_work_and_refuses_new_work():
    embedder = LocalMiniLMEmbedder()
    embedder.load()
    gate = threading.Event()
    blockers = [asyncio.ensure_future(embedder.offload(gate.wait, 30)) for _ in range(embedder.threads)]  # every thread
    queued = [asyncio.ensure_future(embedder.split_async("some text to split")) for _ in range(5)]
    await asyncio.sleep(0)
    await embedder.close()
    gate.set()
    await asyncio.gather(*blockers)
    for job in queued:
        with pytest.raises((asyncio.CancelledError, EmbeddingUnavailable)):
            await job
    with pytest.raises(EmbeddingUnavailable):
        await embedder.embed(["after close"])
