"""The knowledge pages' background passes: the vector fill, pending indexing, and the index rebuild.

A page stored without a vector (the inline embed failed or timed out, or no embedder was wired
when it was written) is embedded by the shared vector fill (``libs.common.fill``), its container
standing where the diary has a seat: ``PAGES`` is the table ``libs.common.vector_passes`` runs
the fill and orphan passes over (``knowledge-fill``, ``knowledge-orphans``, beside
``skill-promotion`` of ``promotion.py``), and ``rebuild_index`` restores the ``knowledge_pages``
collections from the vectors Postgres keeps, without one embedding call. All are idempotent.
"""

from __future__ import annotations

from libs.common import vector_rows
from libs.common.vector_rows import VectorRows
from services.knowledge.domain import COLLECTION_BASE, embedding_text
from services.knowledge.native import NativePages, index_point

__all__ = ["PAGES", "index_pending", "rebuild_index"]


PAGES = VectorRows(
    name="knowledge",
    table="knowledge_pages",
    seat_column="container",
    collection_base=COLLECTION_BASE,
    order_column="update_time",
    text_columns=("title", "body"),
    text=lambda r: embedding_text(r["title"], r["body"]),
    point_columns=(),
    point=lambda r, vec, model: index_point(r["id"], r["company"], r["container"], vec, model),
    # A vector is stored only while the page still has the text it is of: a rewrite meanwhile
    # keeps its own.
    unchanged="title || E'\\n\\n' || body = $TEXT",
)
"""The pages as ``libs.common.vector_rows`` keeps them; a container stands where a seat would."""


async def index_pending(service: NativePages, batch: int = 1000) -> int:
    """Index pages whose vector is stored but not yet in the index (the index was down)."""
    return await vector_rows.index_pending(PAGES, service.store.pool, service.index, service.clock, batch)


async def rebuild_index(service: NativePages, batch: int = 1000) -> int:
    """Restore the index from the vectors Postgres keeps: no embedding call at all."""
    return await vector_rows.rebuild_index(PAGES, service.store.pool, service.index, service.clock, batch)
