"""The two background passes every :class:`~libs.common.vector_rows.VectorRows` table runs, wired
once: ``<prefix>-fill`` (index the rows that wait for the index, then one minute of the shared
vector fill) and ``<prefix>-orphans`` (drop the points whose row is gone)."""

from __future__ import annotations

from libs.common.erasure import sweep_orphans
from libs.common.fill import build_fill
from libs.common.infra import Infra
from libs.common.passrunner import PassSpec
from libs.common.vector_rows import TableFillSource, VectorRows, index_pending
from libs.common.vectorindex import VectorIndex

__all__ = ["vector_row_passes"]


def vector_row_passes(prefix: str, rows: VectorRows, index: VectorIndex, infra: Infra) -> list[PassSpec]:
    """The fill and orphan-sweep passes of ``rows`` over ``index``, on the configured cadences."""
    filler = build_fill(infra, [TableFillSource(rows, infra.pool, index)])

    async def run_fill() -> object:
        indexed = await index_pending(rows, infra.pool, index, infra.clock)
        report = await filler.run_minute() if filler else None
        return {"indexed": indexed, "fill": report}

    return [
        PassSpec(f"{prefix}-fill", run_fill, infra.settings.learning.fill.interval_seconds),
        PassSpec(
            f"{prefix}-orphans",
            lambda: sweep_orphans(infra.pool, index, rows.collection_base, rows.table),
            infra.settings.privacy.orphan_sweep_interval_seconds,
        ),
    ]
