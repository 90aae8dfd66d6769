"""The embedded index's directory has one kind of user at a time: servers and passes (shared, split
mode runs several) or ``./run rebuild-index`` (alone). A rebuild under a running server deleted the
shard files the server had open (both then saw different points, and the server's later writes went
to files no longer on disk); now it refuses in one line, and a server refuses while a rebuild runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from libs.common.vectorindex._port import IndexPoint
from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex
from tests.support.runner import ROOT, clean_env, run_once

COL = "agent_diary_4"


def _point(i: int) -> IndexPoint:
    return IndexPoint(uuid.UUID(int=i), np.array([1.0, 0.1 * i, 0.0, 0.0], dtype=np.float32), "acme", "ana", "m")


async def _ids(index: QdrantEdgeIndex) -> list[int]:
    return sorted(u.int for u in await index.point_ids(COL, None, 100))


async def test_rebuild_index_refuses_while_a_server_has_the_index_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = QdrantEdgeIndex(data / "qdrant-edge")  # what a serving ./run up opened at start
    try:
        await server.upsert(COL, [_point(1)])
        done = await asyncio.to_thread(
            run_once, "rebuild-index", data_dir=data, env=clean_env({"GRPC_ENABLE_FORK_SUPPORT": "0"})
        )
        assert done.returncode == 2, done.stderr[-2000:]
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("agentlearn: the embedded vector index at ") and "stop the server first" in line
        # Nothing was touched: the server's shard is still on disk and in step.
        await server.upsert(COL, [_point(3)])
        assert await _ids(server) == [1, 3]
    finally:
        await server.close()
    again = QdrantEdgeIndex(data / "qdrant-edge")
    try:
        assert await _ids(again) == [1, 3]
    finally:
        await again.close()


async def test_servers_share_the_index_and_a_closed_one_lets_a_rebuild_in(tmp_path: Path) -> None:
    from libs.common.vectorindex.qdrant_edge_index import EdgeIndexInUse, exclusive_edge_index

    root = tmp_path / "edge"
    first, second = QdrantEdgeIndex(root), QdrantEdgeIndex(root)  # split mode: one per service
    await first.close()
    with pytest.raises(EdgeIndexInUse, match="stop the server first"), exclusive_edge_index(root):
        pass
    await second.close()
    with exclusive_edge_index(root):
        rebuilding = QdrantEdgeIndex(root)  # the rebuild's own adapter, in the process holding it
        await rebuilding.upsert(COL, [_point(2)])
        assert await _ids(rebuilding) == [2]
        await rebuilding.close()


def test_a_server_refuses_to_open_the_index_while_a_rebuild_holds_it(tmp_path: Path) -> None:
    from libs.common.vectorindex.qdrant_edge_index import EdgeIndexInUse

    root = tmp_path / "edge"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\n"
            "from libs.common.vectorindex.qdrant_edge_index import exclusive_edge_index\n"
            f"with exclusive_edge_index(Path({str(root)!r})):\n"
            "    print('held', flush=True)\n"
            "    sys.stdin.read()\n",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(EdgeIndexInUse, match=r"being rebuilt by another process \(\./run rebuild-index\)"):
            QdrantEdgeIndex(root)
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
        opened = QdrantEdgeIndex(root)  # the rebuild ended: the server starts
        asyncio.run(opened.close())
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
