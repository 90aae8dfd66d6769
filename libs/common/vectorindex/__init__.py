"""The vector-index seam: similarity search filtered by company, seat, model and expiry.

Two adapters behind one port, held to one conformance suite (``tests/test_vector_index_conformance.py``):
Qdrant through ``qdrant-client`` (a server by URL, or its local mode) and Qdrant's engine embedded
in-process (``qdrant-edge-py``). Postgres keeps every row's own vector, so an index can always be
rebuilt from it without one embedding call, and a read whose index is unreachable falls back to an
exact per-seat scan in Postgres (each store implements that scan itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.common.vectorindex._port import (
    NO_EXPIRY,
    IndexHit,
    IndexPoint,
    IndexUnavailable,
    VectorIndex,
    collection_name,
)

if TYPE_CHECKING:
    from libs.common.config import Settings

__all__ = [
    "NO_EXPIRY",
    "IndexHit",
    "IndexPoint",
    "IndexUnavailable",
    "VectorIndex",
    "build_vector_index",
    "collection_name",
]


def build_vector_index(settings: Settings) -> VectorIndex:
    """The configured adapter: a Qdrant server by URL, else the embedded engine under data_dir."""
    mode = settings.vector_index
    if mode == "auto":
        mode = "qdrant" if settings.qdrant_url else "edge"
    if mode == "qdrant":
        from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return QdrantClientIndex.for_url(settings.qdrant_url, api_key=key)
    if mode == "local":
        from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex

        return QdrantClientIndex.local(settings.data_dir / "qdrant-local")
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    return QdrantEdgeIndex(settings.data_dir / "qdrant-edge")
