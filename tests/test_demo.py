"""``./run demo`` against a running system: the scripted life teaches what the new turns are shown."""

from __future__ import annotations

import asyncio
import re

from libs.common.clock import SystemClock
from services.runner import demo
from tests.support.app import open_app


async def test_the_demo_shows_what_earlier_turns_taught(make_settings, dsn, local_embedder, edge_index, capsys):
    async with open_app(make_settings(), dsn, clock=SystemClock(), embedder=local_embedder, index=edge_index) as app:
        workers = [asyncio.create_task(bg()) for c in app.components.values() for bg in c.background]
        try:
            assert await demo.main(["--address", f"127.0.0.1:{app.port}", "--company", "demo-test"]) == 0
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    out = capsys.readouterr().out
    assert "submitting 11 turns" in out and "not reflected" not in out
    assert "## Personal memory" in out and "Bob prefers weekly digests over daily pings." in out
    bob = out.split("New turn: Bob asks for a payments update")[1].split("New turn:")[0]
    # Bob's vacation ended weeks before these turns start: not remembered as current state.
    assert "## Personal memory" in bob and "vacation until" not in bob.split("## Personal memory")[1].split("##")[0]
    # Only related turns are "similar": the flaky-test fixes have nothing to do with payments.
    prior = bob.split("## Similar prior work")[1].split("\n## ")[0]
    assert "payments migration" in prior and "flaky" not in prior
    assert "## Similar prior work" in out and "Fix the flaky" in out
    # Two workers reflect at once, so whichever flaky-test turn comes first names the skill.
    assert "## Synthesized skills you've learned" in out and re.search(r"\*\*fix-flaky-\w+-test\*\*", out)
    assert "## Counterparty: Bob (slack)" in out
    assert "thin trigger" in out and "call refresh_memory" in out
    # The session: a plan milestone, a substantial turn and a manual check, with their receipts.
    assert "plan revision 1 (proposed): no check" in out and "steps newly done ['reproduce']" in out
    assert "1 check queued" in out and "reused: True" in out
    receipts = out.split("learning receipts")[1]
    for trigger in ("plan_steps_done", "substantial_turn", "manual"):
        assert re.search(rf"{trigger}\s+completed\s+completed", receipts), trigger
    assert "written project_lesson" in receipts and "written personal_fact" in receipts
    assert "written skill_proposal" in receipts and "1 secret redacted" in receipts
    assert "project lesson in workspace:payments" in out
    proposals = out.split("skill proposals awaiting approval")[1]
    assert "[pending]" in proposals and "make -> grep -> claude-code -> git -> gh" in proposals
