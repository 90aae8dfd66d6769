"""The episodes' index passes: index what waits for the index, rebuild the index from Postgres, and
the table as ``libs.common.vector_rows`` keeps it (raw rows only), which ``libs.common.vector_passes``
runs the fill and orphan passes over.

``services.runner`` wraps each in a lease claim (``episode-fill``; the lifecycle is
``episode-lifecycle``, in ``lifecycle.py``), the all-in-one ticks it on its cadence, and a
Kubernetes CronJob runs it as ``./run pass <name>``. All are idempotent.
"""

from __future__ import annotations

from libs.common import vector_rows
from libs.common.vector_rows import VectorRows
from services.episodes.domain import COLLECTION_BASE, vector_text
from services.episodes.service import EpisodeService, index_point

__all__ = ["RAW_EPISODES", "VECTOR_TEXT_SQL", "index_pending", "rebuild_index"]


_WHITESPACE = "E'" + "".join(f"\\u{ord(c):04x}" for c in map(chr, range(0x10000)) if c.isspace()) + "'"
"""What Python's ``str.strip`` strips (every such character is in the BMP), as a SQL literal."""


def _part(column: str) -> str:
    return f"CASE WHEN btrim({column}, {_WHITESPACE}) <> '' THEN {column} END"


VECTOR_TEXT_SQL = f"concat_ws(E'\\n', {_part('label')}, {_part('ask')}, {_part('what_it_did')})"
"""``domain.vector_text`` of a row, in SQL: the three parts joined by a newline, a part with nothing
but whitespace (as Python judges it) left out."""

RAW_EPISODES = VectorRows(
    name="episodes",
    table="episodes",
    seat_column="seat",
    collection_base=COLLECTION_BASE,
    order_column="end_time",
    text_columns=("label", "ask", "what_it_did"),
    text=lambda r: vector_text(r["label"], r["ask"], r["what_it_did"]),
    point_columns=("outcome",),
    point=lambda r, vec, model: index_point(r["id"], r["company"], r["seat"], r["outcome"], vec, model),
    live="kind = 'raw'",
    # A vector is stored only while the row still has the text it is of: a self_iterate row the
    # turn's settled record superseded meanwhile has another text (and its own vector, or none).
    unchanged=f"{VECTOR_TEXT_SQL} = $TEXT",
)
"""Raw episodes as ``libs.common.vector_rows`` keeps them: a compacted row is never embedded, never
indexed. The text is the row's one vector text, so a long ask goes a request at a time across
minutes (``libs.common.fill``)."""


async def index_pending(service: EpisodeService, batch: int = 1000) -> int:
    """Index rows whose vector is stored but not yet in the index (the index was down)."""
    return await vector_rows.index_pending(RAW_EPISODES, service.store.pool, service.index, service.clock, batch)


async def rebuild_index(service: EpisodeService, batch: int = 1000) -> int:
    """Restore the index from the vectors Postgres keeps (raw rows only): no embedding call."""
    return await vector_rows.rebuild_index(RAW_EPISODES, service.store.pool, service.index, service.clock, batch)
