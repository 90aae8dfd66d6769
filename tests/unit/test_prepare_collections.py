"""A server opens its services' vector collections at start (``prepare_collections``), each family
once at the embedder's width; an index that is down at start is logged and left to the first write."""

from __future__ import annotations

import logging

import pytest

from libs.common.component import Component, prepare_collections
from libs.common.vectorindex import collection_name
from libs.common.vectorindex.exact_scan import ExactScanIndex


def _component(name: str, *bases: str) -> Component:
    return Component(name=name, registrations=[], vector_collections=list(bases))


async def test_every_family_is_opened_once_at_the_embedders_width():
    index = ExactScanIndex()
    components = [
        _component("diary", "diary_notes"),
        _component("skills"),
        _component("again", "diary_notes", "episodes"),
    ]
    opened = await prepare_collections(components, index, 384)
    assert opened == [collection_name("diary_notes", 384), collection_name("episodes", 384)]
    assert await index.collections() == opened
    assert await prepare_collections([_component("profiles")], index, 384) == []
    # No width known (no embedder, or a remote one not yet asked): nothing opened, left to the first write.
    assert await prepare_collections([_component("episodes", "episodes")], ExactScanIndex(), None) == []


async def test_an_index_down_at_start_is_logged_and_does_not_stop_the_start(caplog: pytest.LogCaptureFixture):
    index = ExactScanIndex()
    index.available = False
    with caplog.at_level(logging.WARNING, logger="libs.common.component"):
        opened = await prepare_collections([_component("diary", "diary_notes")], index, 384)
    assert opened == []
    assert "could not open the vector collection diary_notes_384 at start" in caplog.text
    index.available = True
    assert await index.collections() == []  # nothing was opened; the first write opens it
