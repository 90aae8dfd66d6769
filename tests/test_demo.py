"""``./run demo`` against a running system: the scripted life teaches what the new turns are shown."""

from __future__ import annotations

import asyncio
import contextlib
import re

from libs.common.clock import SystemClock
from services.runner import demo
from tests.support.app import open_app


async def test_the_demo_shows_what_earlier_turns_taught(make_settings, dsn, local_embedder, edge_index, capsys):
    async with open_app(make_settings(), dsn, clock=SystemClock(), embedder=local_embedder, index=edge_index) as app:
        workers = asyncio.create_task(app.components["reflector"].background[0]())
        try:
            assert await demo.main(["--address", f"127.0.0.1:{app.port}", "--company", "demo-test"]) == 0
        finally:
            workers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await workers
    out = capsys.readouterr().out
    assert "submitting 11 turns" in out and "not reflected" not in out
    assert "## Personal memory" in out and "Bob prefers weekly digests over daily pings." in out
    assert "## Similar prior work" in out and "Fix the flaky" in out
    # Two workers reflect at once, so whichever flaky-test turn comes first names the skill.
    assert "## Synthesized skills you've learned" in out and re.search(r"\*\*fix-flaky-\w+-test\*\*", out)
    assert "## Counterparty: Bob (slack)" in out
    assert "thin trigger" in out and "call refresh_memory" in out
