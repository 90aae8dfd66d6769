"""The inspector renders by the settings of the services whose bounds its pages follow, as the
deployment configures them (its bootstrap passes them), not by their defaults: a session's checks
are paged by ``sessions.list_default``, and a diary search asks RecallNotes for no more than
``learning.diary.max_recall_limit``. Real services over gRPC, the real HTTP app on loopback."""

from __future__ import annotations

import html
import re

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as ss_grpc
from libs.common.clock import ManualClock
from tests.support.sessions import result, verification
from tests.test_inspector_support import NOW, inspector_settings, open_inspector

SESSION = "/inspector/c/acme/sessions/s1"


def check_ids(page: str) -> list[str]:
    return re.findall(r'id="check-([^"]+)"', page)


def next_link(page: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', page)
    return html.unescape(found.group(1)) if found else None


async def test_pages_follow_the_configured_sessions_and_diary_settings(make_settings, dsn, local_embedder, edge_index):
    clock = ManualClock(NOW)
    settings = inspector_settings(
        make_settings, sessions={"list_default": 2}, learning={"diary": {"max_recall_limit": 20}}
    )
    async with open_inspector(
        settings, dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local"
    ) as inspector:
        sessions = inspector.stub(ss_grpc.SessionServiceStub)
        await sessions.AppendSessionEvents(
            ss_pb.AppendSessionEventsRequest(
                company="acme",
                session_id="s1",
                user="dana",
                seat="ana",
                role="swe",
                events=[
                    result("r1", "make", "build ok", clock.now()),
                    verification("v1", "pytest", "4 passed", clock.now()),
                ],
            )
        )
        for _ in range(3):  # three checks (a queued one is answered again until it has run)
            clock.advance(minutes=1)
            await sessions.CheckRecentWork(ss_pb.CheckRecentWorkRequest(company="acme", session_id="s1", user="dana"))
            await inspector.app.components["sessions"].service.worker.drain()
        everything = await sessions.ListLearningChecks(
            ss_pb.ListLearningChecksRequest(company="acme", session_id="s1", user="dana", page_size=10)
        )
        newest_first = [c.check_id for c in everything.checks]
        assert len(newest_first) == 3
        await inspector.diary.WriteNote(
            diary_pb.WriteNoteRequest(
                company="acme",
                seat="ana",
                content="Bob wants the deploy report every Friday.",
                tier=diary_pb.NOTE_TIER_LONG,
            )
        )
        async with inspector.client() as client:
            # The session's checks in pages of the configured two (the default 30 showed all three).
            first = await client.get(SESSION)
            assert first.status_code == 200 and check_ids(first.text) == newest_first[:2]
            following = next_link(first.text)
            assert following is not None
            second = await client.get(SESSION + following)  # the pager's link is relative: ?page=…
            assert check_ids(second.text) == newest_first[2:] and next_link(second.text) is None
            # A diary search within the configured recall bound (50 a half was refused: LIMIT_OUT_OF_RANGE).
            found = await client.get("/inspector/c/acme/s/ana/diary", params={"q": "deploy report"})
            assert found.status_code == 200, found.text
            assert "Bob wants the deploy report every Friday." in found.text
