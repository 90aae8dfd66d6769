"""The local embedder's short-text path (issue 14): an ASCII text of up to 254 characters is embedded
without the split, and its vector is the one the split path gives."""

from __future__ import annotations

import numpy as np
import pytest

from libs.common.embeddings._port import embed_texts

TEXTS = [
    "",
    "   ",
    "Bob prefers weekly digests.",
    "!?" * 127,  # 254 characters, one word piece each: the longest that takes the short path
    "x" * 254,
    "a" * 255,  # one character more: split path
    "Ünïcödé — not ASCII: split path",
    "word " * 60,
]


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # "" pools to none, either way
async def test_short_texts_get_the_vector_the_split_path_gives(local_embedder):
    assert [local_embedder._one_piece(t) for t in TEXTS] == [True, True, True, True, True, False, False, False]
    assert local_embedder.split("!?" * 127) == ["!?" * 127]
    fast = await local_embedder.embed(TEXTS)
    slow = await embed_texts(local_embedder, TEXTS, local_embedder.offload)
    for a, b in zip(fast, slow, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert a.model == b.model
            np.testing.assert_array_equal(a.values, b.values)
