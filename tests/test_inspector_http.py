"""The inspector over real HTTP (the app ``./run up`` serves, uvicorn on loopback, httpx with a
cookie jar) with real tokens in tokens mode: sign-in and its cookie, a token of one company that
sees nothing of another, reading without ``inspect``, changes without their write scope, forms
without their token or from another site, and pages that show what the services' RPCs hold, paged
and searchable. Every change is checked through gRPC, never through the page that made it."""

from __future__ import annotations

import re
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as ss_grpc
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.telemetry.v1 import telemetry_service_pb2 as tm_pb
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as tm_grpc
from libs.common.clock import ManualClock
from tests.support.sessions import result, verification
from tests.test_inspector_support import NOW, csrf_of, inspector_settings, open_inspector, seeded_env

PAGE_SIZE = 2
SEAT = "/inspector/c/acme/s/ana/"


@pytest.fixture(scope="module")
async def env(pg_uri, template_db, tmp_path_factory, local_embedder):
    async with seeded_env(
        pg_uri,
        template_db,
        tmp_path_factory.mktemp("inspector-http"),
        local_embedder,
        inspector={"page_size": PAGE_SIZE},
    ) as pair:
        yield pair


def text_of(html: str) -> str:
    """The visible text of a page, tags dropped (what a reader sees, for "is it on the page")."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


async def note_exists(inspector, company: str, seat: str, note_id: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        await inspector.diary.GetNote(diary_pb.GetNoteRequest(company=company, seat=seat, note_id=note_id))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
        return False
    return True


async def test_the_root_redirects_and_an_anonymous_browser_is_sent_to_sign_in(env):
    inspector, seeded = env
    async with inspector.client() as client:
        root = await client.get("/")
        assert root.status_code == 302 and root.headers["location"] == "/inspector/"
        page = await client.get("/inspector/c/acme/s/ana/diary")
        assert page.status_code == 303
        assert page.headers["location"] == "/inspector/signin?next=/inspector/c/acme/s/ana/diary"
        assert "Bob wants" not in page.text
        posted = await client.post(f"{SEAT}diary/{seeded.notes['bob']}/delete", data={"csrf": "x"})
        assert posted.status_code == 401
        script = await client.get("/inspector/static/htmx.min.js")
        assert script.status_code == 200 and "htmx" in script.text[:2000]
        # The sessions API keeps answering a missing credential with its JSON 401, not a redirect.
        api = await client.get("/api/sessions/s/learning")
        assert api.status_code == 401 and api.json()["error"]["reason"] == "CREDENTIAL_MISSING"
    assert await note_exists(inspector, "acme", "ana", seeded.notes["bob"])


async def test_sign_in_keeps_the_token_in_an_httponly_strict_cookie_and_opens_its_company(env):
    inspector, _ = env
    token = await inspector.token("acme", "inspect")
    async with inspector.client() as client:
        form = await client.get("/inspector/signin")
        assert form.status_code == 200 and 'type="password"' in form.text and '<label for="token">' in form.text
        refused = await client.post("/inspector/signin", data={"token": token})  # no form token
        assert refused.status_code == 403 and "set-cookie" not in refused.headers
        signed = await client.post(
            "/inspector/signin", data={"csrf": csrf_of(form.text), "token": token, "next": "https://evil.example/"}
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/inspector/"  # never another site
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"agentlearn_token={token};")
        attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
        assert {"httponly", "path", "max-age", "samesite"} <= attributes and "secure" not in attributes
        assert "samesite=strict" in cookie.lower() and "path=/inspector" in cookie.lower()
        home = await client.get("/inspector/")
        assert home.status_code == 303 and home.headers["location"] == "/inspector/c/acme/"
        seats = await client.get("/inspector/c/acme/")
        assert seats.status_code == 200
        assert "ana" in text_of(seats.text) and "bo" in text_of(seats.text)
        assert "Local mode" not in seats.text
    # Served over TLS (a proxy uvicorn trusts says so), the cookie is Secure.
    async with inspector.client(headers={"x-forwarded-proto": "https"}) as client:
        form = await client.get("/inspector/signin")
        signed = await client.post("/inspector/signin", data={"csrf": csrf_of(form.text), "token": token})
        assert "secure" in {a.strip().lower() for a in signed.headers["set-cookie"].split(";")}
    # A token that does not verify comes back to the form with the reason, and its cookie is cleared.
    async with inspector.client() as client:
        form = await client.get("/inspector/signin")
        await client.post("/inspector/signin", data={"csrf": csrf_of(form.text), "token": "agl_not-a-real-token"})
        page = await client.get("/inspector/c/acme/")
        assert page.status_code == 303 and "error=CREDENTIAL_INVALID" in page.headers["location"]
        assert 'agentlearn_token=""' in page.headers["set-cookie"] and "Max-Age=0" in page.headers["set-cookie"]
        again = await client.get(page.headers["location"])
        assert "unknown, revoked or expired" in again.text


async def test_a_token_of_one_company_sees_nothing_of_another(env):
    inspector, seeded = env
    async with inspector.signed_in(await inspector.token("acme", "admin")) as client:
        csrf = csrf_of((await client.get(SEAT + "diary")).text)
        for path in (
            "/inspector/c/globex/",
            "/inspector/c/globex/sessions",
            "/inspector/c/globex/s/carl/",
            "/inspector/c/globex/s/carl/diary",
            "/inspector/c/globex/s/carl/skills",
            "/inspector/c/globex/s/carl/events",
            "/inspector/c/globex/s/nobody/profiles",  # a seat that does not exist: the same answer
        ):
            page = await client.get(path)
            assert page.status_code == 403, path
            assert "GLOBEX-SECRET" not in page.text and "globex-secret-skill" not in page.text, path
            assert "bound to another company or seat" in page.text
        posted = await client.post(f"/inspector/c/globex/s/carl/diary/{seeded.globex_note}/delete", data={"csrf": csrf})
        assert posted.status_code == 403
    assert await note_exists(inspector, "globex", "carl", seeded.globex_note)
    # A token bound to one seat sees that seat only, and its company page lists only it.
    async with inspector.signed_in(await inspector.token("acme", "inspect", seat="ana")) as client:
        assert (await client.get("/inspector/")).headers["location"] == SEAT
        assert (await client.get("/inspector/c/acme/s/bo/")).status_code == 403
        assert (await client.get(SEAT)).status_code == 200
        listing = text_of((await client.get("/inspector/c/acme/")).text)
        assert "ana" in listing and " bo " not in listing


async def test_reading_needs_inspect_and_a_change_needs_its_write_scope(env):
    inspector, seeded = env
    async with inspector.signed_in(await inspector.token("acme", "memory:read", "memory:write")) as reader:
        page = await reader.get("/inspector/c/acme/")
        assert page.status_code == 403 and "inspect or admin" in page.text
    async with inspector.signed_in(await inspector.token("acme", "inspect")) as viewer:
        diary = await viewer.get(SEAT + "diary")
        assert diary.status_code == 200 and '<tr id="note-' in diary.text
        assert "/delete" not in diary.text and "Read-only" in diary.text  # no button it could not use
        refused = await viewer.post(f"{SEAT}diary/{seeded.notes['bob']}/delete", data={"csrf": csrf_of(diary.text)})
        assert refused.status_code == 403 and "memory:write" in refused.text
        skill = await viewer.get(f"{SEAT}skills/{seeded.other_skill_id}")
        refused = await viewer.post(f"{SEAT}skills/{seeded.other_skill_id}/pin", data={"csrf": csrf_of(skill.text)})
        assert refused.status_code == 403
    async with inspector.signed_in(await inspector.token("acme", "inspect", "memory:write")) as writer:
        proposals = await writer.get(SEAT + "proposals")
        assert "/approve" not in proposals.text and "needs a token with the <code>admin</code> scope" in proposals.text
        refused = await writer.post(
            f"{SEAT}proposals/{seeded.proposal_id}/approve", data={"csrf": csrf_of(proposals.text)}
        )
        assert refused.status_code == 403 and "admin" in refused.text
    assert await note_exists(inspector, "acme", "ana", seeded.notes["bob"])
    got = await inspector.skills.GetSkill(
        sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=seeded.other_skill_id)
    )
    assert got.skill.pinned is False
    pending = await inspector.skills.ListSkillProposals(
        sk_pb.ListSkillProposalsRequest(company="acme", seat="ana", state=sk_pb.PROPOSAL_STATE_PENDING)
    )
    assert [p.id for p in pending.proposals] == [seeded.proposal_id]


async def test_a_rollback_to_a_version_no_skill_can_have_asks_for_a_version_and_changes_nothing(env):
    inspector, seeded = env
    before = await inspector.skills.GetSkill(
        sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=seeded.other_skill_id)
    )
    async with inspector.signed_in(await inspector.token("acme", "inspect", "memory:write")) as client:
        csrf = csrf_of((await client.get(f"{SEAT}skills/{seeded.other_skill_id}")).text)
        url = f"{SEAT}skills/{seeded.other_skill_id}/rollback"
        # Past int32 (the proto's type) either way, not a number, none, and below the first version.
        for version in ("3000000000", "-3000000000", "2147483648", "two", "", "0", "-1"):
            refused = await client.post(url, data={"csrf": csrf, "version": version})
            assert refused.status_code == 400 and "Choose a version" in refused.text, (version, refused.status_code)
    after = await inspector.skills.GetSkill(
        sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=seeded.other_skill_id)
    )
    assert after.skill.version == before.skill.version


async def test_a_form_without_its_token_or_from_another_site_is_refused(env):
    inspector, seeded = env
    note = seeded.notes["staging"]
    async with inspector.signed_in(await inspector.token("acme", "inspect", "memory:write")) as client:
        diary = await client.get(SEAT + "diary")
        csrf = csrf_of(diary.text)
        url = f"{SEAT}diary/{note}/delete"
        for data, headers in [
            ({}, {}),
            ({"csrf": "0" * 64}, {}),
            ({"csrf": csrf}, {"origin": "https://evil.example"}),
            ({"csrf": csrf}, {"origin": "null"}),
        ]:
            refused = await client.post(url, data=data, headers=headers)
            assert refused.status_code == 403 and "security token" in refused.text, (data, headers)
        assert await note_exists(inspector, "acme", "ana", note)
        # Another browser session's token does not fit this one.
        async with inspector.signed_in(await inspector.token("acme", "inspect", "memory:write")) as other:
            foreign = csrf_of((await other.get(SEAT + "diary")).text)
        assert foreign != csrf
        assert (await client.post(url, data={"csrf": foreign})).status_code == 403
        assert await note_exists(inspector, "acme", "ana", note)
        done = await client.post(url, data={"csrf": csrf}, headers={"origin": inspector.base_url})
        assert done.status_code == 303 and done.headers["location"].endswith("diary?done=note_deleted")
    assert not await note_exists(inspector, "acme", "ana", note)


async def test_pages_show_what_the_services_hold_and_never_raw_session_evidence(env):
    inspector, seeded = env
    async with inspector.signed_in(await inspector.token("acme", "inspect")) as client:
        seats = text_of((await client.get("/inspector/c/acme/")).text)
        assert re.search(r"bo 1 0 0\.00 below 0\.1", seats)  # bo's one skill is unused: below the threshold
        overview = text_of((await client.get(SEAT)).text)
        rates = await tm_grpc.TelemetryServiceStub(inspector.channel).GetPrefetchHitRates(
            tm_pb.GetPrefetchHitRatesRequest(company="acme", seat="ana")
        )
        assert rates.totals
        for total in rates.totals:
            row = f"{total.block.replace('_', ' ')} {total.turn_count} {total.hit_count} {round(total.hit_rate * 100)}%"
            assert row in overview
        assert "Proposals waiting 1" in overview
        compacted = text_of((await client.get(f"{SEAT}episodes/{seeded.compacted_id}")).text)
        assert len(seeded.exemplars) >= 2
        for run in seeded.exemplars:
            assert f"Run {run}" in compacted
        kept = await ep_grpc.EpisodeServiceStub(inspector.channel).GetEpisode(
            ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id=seeded.exemplars[0])
        )
        assert kept.episode.ask in compacted
        reflections = text_of((await client.get(SEAT + "reflections")).text)
        assert "Run turn-reflected" in reflections and "episodist wrote" in reflections
        proposals = text_of((await client.get(SEAT + "proposals")).text)
        assert "rotate-api-keys" in proposals and "ev-7" in proposals and "plan:2:s3" in proposals
        sessions = text_of((await client.get("/inspector/c/acme/sessions")).text)
        assert seeded.session_id in sessions and "dana" in sessions
        session = await client.get(f"/inspector/c/acme/sessions/{seeded.session_id}")
        assert session.status_code == 200
        shown = text_of(session.text)
        assert "manual check" in shown and "personal fact" in shown
        for raw in ("I review deploys on Tuesdays", "build ok", "42 passed"):
            assert raw not in session.text  # receipts only
        assert (await client.get("/inspector/c/acme/sessions/no-such-session")).status_code == 404


async def test_knowledge_drafts_wait_for_a_lead_on_their_own_page(env):
    inspector, seeded = env
    async with inspector.signed_in(await inspector.token("acme", "inspect")) as client:
        page = await client.get("/inspector/c/acme/drafts")
        assert page.status_code == 200
        shown = text_of(page.text)
        assert "[Auto-draft] Rotate on-call handover" in shown and "space eng" in shown
        assert "Page the next on-call." in page.text and f'id="draft-{seeded.draft_id}"' in page.text
        assert "GLOBEX-SECRET" not in page.text
        none = text_of((await client.get("/inspector/c/acme/drafts", params={"q": "kafka"})).text)
        assert "No draft matches" in none
        assert (await client.get("/inspector/c/globex/drafts")).status_code == 403
    async with inspector.signed_in(await inspector.token("acme", "inspect", seat="ana")) as client:
        refused = await client.get("/inspector/c/acme/drafts")
        assert refused.status_code == 403 and "Rotate on-call" not in refused.text


def seat_links(html: str) -> set[str]:
    """The seats a company page lists (its table's row headers)."""
    return set(re.findall(r'<th scope="row"><a href="/inspector/c/acme/s/([^/"]+)/">', html))


async def test_a_token_bound_to_a_seat_or_a_user_gets_no_company_wide_list(env):
    """The services refuse every seat's or user's rows of the company to a token bound to a seat or
    a user (COMPANY_WIDE_CREDENTIAL_REQUIRED); the inspector calls them as itself, so it applies the
    rule: the drafts are 403 and the seat list is the token's own."""
    inspector, _ = env
    async with inspector.signed_in(await inspector.token("acme", "inspect")) as client:
        seats = await client.get("/inspector/c/acme/")
        assert seats.status_code == 200 and seat_links(seats.text) == {"ana", "bo"}
        assert "bound to" not in text_of(seats.text) and 'href="/inspector/c/acme/drafts"' in seats.text
        assert "Rotate on-call" in (await client.get("/inspector/c/acme/drafts")).text
    bound = [
        ({"user": "carla"}, "user carla", set()),  # no session of carla's: no seat
        ({"user": "dana"}, "user dana", {"ana"}),  # dana's one session is on seat ana
        ({"seat": "ana"}, "seat ana", {"ana"}),
        ({"seat": "ana", "user": "dana"}, "seat ana", {"ana"}),
    ]
    for binding, named, own in bound:
        for scope in ("inspect", "admin"):  # admin is every scope, never a wider company
            async with inspector.signed_in(await inspector.token("acme", scope, **binding)) as client:
                drafts = await client.get("/inspector/c/acme/drafts")
                assert drafts.status_code == 403, (binding, scope)
                assert "Rotate on-call" not in drafts.text and f"bound to {named}" in text_of(drafts.text)
                searched = await client.get("/inspector/c/acme/drafts", params={"q": "on-call"})
                assert searched.status_code == 403 and "Rotate on-call" not in searched.text
                seats = await client.get("/inspector/c/acme/")
                assert seats.status_code == 200, (binding, scope)
                assert seat_links(seats.text) == own, (binding, scope)
                assert f"This token is bound to {named}" in text_of(seats.text)
                assert 'href="/inspector/c/acme/drafts"' not in seats.text  # no tab to a page it cannot read
                found = await client.get("/inspector/c/acme/", params={"q": "b"})
                assert seat_links(found.text) == set(), (binding, scope)  # bo is not searched either
        async with inspector.signed_in(await inspector.token("acme", "inspect", **binding)) as client:
            listed = text_of((await client.get("/inspector/c/acme/sessions")).text)
            assert ("sess-ana-1" in listed) == bool(own), binding  # dana's session on ana, carla's none


async def test_the_seat_search_runs_in_the_event_log_past_the_listing_cut(
    make_settings, dsn, local_embedder, edge_index
):
    """``seats_scan_limit`` cuts the list the company page merges, never what a search finds: the
    event log searches the handle itself (``ListSeatActivity.query``), and the episodes' seats are
    matched as they are read."""
    settings = inspector_settings(make_settings, inspector={"seats_scan_limit": 100})  # its least
    clock = ManualClock(NOW)
    async with open_inspector(
        settings, dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local"
    ) as inspector:
        for seat in [f"s{i:03}" for i in range(100)] + ["zed"]:  # in the event log only; zed past the cut
            await inspector.app.infra.events.emit_strict("prefetch_summary", company="acme", seat=seat)
        await ep_grpc.EpisodeServiceStub(inspector.channel).RecordEpisode(  # in the episodes only
            ep_pb.RecordEpisodeRequest(
                company="acme",
                seat="yan",
                turn_id="t-1",
                label="Message",
                outcome=ep_pb.TURN_OUTCOME_DONE,
                start_time=Timestamp(seconds=int(NOW.timestamp()) - 60),
                end_time=Timestamp(seconds=int(NOW.timestamp())),
            )
        )
        clock.advance(minutes=1)  # the window ends at now, exclusive
        async with inspector.client() as client:
            listed = await client.get("/inspector/c/acme/")
            assert "s000" in seat_links(listed.text) and "more seats than the inspector lists" in listed.text
            for q, seat in (("ZE", "zed"), ("yan", "yan")):
                found = await client.get("/inspector/c/acme/", params={"q": q})
                assert found.status_code == 200 and seat_links(found.text) == {seat}, q


async def test_lists_are_paged_and_searchable(env):
    inspector, _ = env
    async with inspector.signed_in(await inspector.token("acme", "inspect")) as client:
        listed = await inspector.diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=500))
        assert len(listed.notes) > PAGE_SIZE
        seen: list[str] = []
        url = SEAT + "diary"
        while url:
            page = await client.get(url)
            rows = re.findall(r'<tr id="note-([0-9a-f-]+)">', page.text)
            assert 0 < len(rows) <= PAGE_SIZE
            seen += rows
            following = re.search(r'<a href="(\?[^"]*page=[^"]+)" rel="next">Next page</a>', page.text)
            url = SEAT + "diary" + following.group(1).replace("&amp;", "&") if following else ""
        assert seen == [n.id for n in listed.notes]  # every note once, newest first
        found = await client.get(SEAT + "diary", params={"q": "Bob deploy report"})
        assert re.findall(r'<tr id="note-([0-9a-f-]+)">', found.text)[0] in {
            n.id for n in listed.notes if "Bob" in n.content
        }
        skills = text_of((await client.get(SEAT + "skills", params={"q": "DEPLOY"})).text)
        assert "deploy-checklist" in skills and "triage-tickets" not in skills
        profiles = text_of((await client.get(SEAT + "profiles", params={"q": "kafka"})).text)
        assert "bob on slack" in profiles
        none = text_of((await client.get(SEAT + "profiles", params={"q": "zzz-nothing"})).text)
        assert "No profile matches" in none
        events = text_of((await client.get(SEAT + "events", params={"q": "skill_refined"})).text)
        assert "skill_refined" in events and "prefetch_summary" not in events
        seats = text_of((await client.get("/inspector/c/acme/", params={"q": "B"})).text)
        assert "bo" in seats and "ana" not in seats.split("Seats matching")[1]


async def test_local_mode_opens_without_a_token_says_so_on_every_page_and_still_checks_forms(
    make_settings, dsn, local_embedder, edge_index
):
    clock = ManualClock(NOW)
    async with open_inspector(
        inspector_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local"
    ) as inspector:
        written = await inspector.diary.WriteNote(
            diary_pb.WriteNoteRequest(company="acme", seat="ana", content="A note.", tier=diary_pb.NOTE_TIER_LONG)
        )
        async with inspector.client() as client:
            for path in (
                "/inspector/",
                "/inspector/signin",
                "/inspector/c/acme/",
                "/inspector/c/acme/sessions",
                SEAT,
                SEAT + "diary",
                SEAT + "episodes",
                SEAT + "skills",
                SEAT + "proposals",
                SEAT + "profiles",
                SEAT + "reflections",
                SEAT + "events",
                "/inspector/c/acme/s/ana/skills/not-a-uuid",  # an error page says so too
            ):
                page = await client.get(path)
                assert page.status_code in (200, 404), path
                assert "Local mode: no sign-in." in page.text, path
            diary = await client.get(SEAT + "diary")
            url = f"{SEAT}diary/{written.note.id}/delete"
            assert (await client.post(url, data={})).status_code == 403
            assert (await client.post(url, data={"csrf": csrf_of(diary.text)})).status_code == 303
        assert not await note_exists(inspector, "acme", "ana", written.note.id)


async def _a_note_and_a_session(inspector: Any, clock: ManualClock) -> tuple[Any, Any]:
    """What a cross-site request would change: ana's note, and session s1's work (a learning check
    could be queued for it). The written note's answer and a SessionService stub."""
    written = await inspector.diary.WriteNote(
        diary_pb.WriteNoteRequest(company="acme", seat="ana", content="A note.", tier=diary_pb.NOTE_TIER_LONG)
    )
    sessions = inspector.stub(ss_grpc.SessionServiceStub)
    t = clock.now()
    await sessions.AppendSessionEvents(
        ss_pb.AppendSessionEventsRequest(
            company="acme",
            session_id="s1",
            user="dana",
            seat="ana",
            role="swe",
            events=[result("r1", "make", "build ok", t), verification("v1", "pytest", "42 passed", t)],
        )
    )
    return written, sessions


async def test_local_mode_answers_only_loopback_names_and_takes_no_change_from_another_site(
    make_settings, dsn, local_embedder, edge_index
):
    """Local mode trusts this machine, not a web page its browser opens. DNS rebinding (the page's
    own name now resolving to 127.0.0.1, so the browser sends ``Host: attacker.example``) gets
    nothing; a cross-site POST (a form needs no preflight) changes nothing, on the inspector and
    the sessions API alike; the machine's own clients keep working by any loopback name."""
    clock = ManualClock(NOW)
    async with open_inspector(
        inspector_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local"
    ) as inspector:
        written, sessions = await _a_note_and_a_session(inspector, clock)
        port = inspector.base_url.rsplit(":", 1)[1]
        learning = "/api/sessions/s1/learning?company=acme&user=dana"
        async with inspector.client() as client:
            diary = await client.get(SEAT + "diary")
            csrf = csrf_of(diary.text)
            delete = f"{SEAT}diary/{written.note.id}/delete"
            rebound = {"host": f"attacker.example:{port}"}
            for path in ("/inspector/", SEAT + "diary", learning, "/metrics"):
                refused = await client.get(path, headers=rebound)
                assert refused.status_code == 421, path
                assert refused.json()["error"]["reason"] == "HOST_NOT_LOOPBACK" and "A note." not in refused.text
            refused = await client.post(
                delete, data={"csrf": csrf}, headers={**rebound, "origin": f"http://{rebound['host']}"}
            )
            assert refused.status_code == 421
            for origin in ("https://evil.example", "null", f"http://attacker.example:{port}"):
                form = await client.post(delete, data={"csrf": csrf}, headers={"origin": origin})
                assert form.status_code == 403, origin
                post = await client.post(learning, headers={"origin": origin})
                assert (post.status_code, post.json()["error"]["reason"]) == (403, "ORIGIN_NOT_SAME"), origin
            assert await note_exists(inspector, "acme", "ana", written.note.id)
            checks = await sessions.ListLearningChecks(
                ss_pb.ListLearningChecksRequest(company="acme", session_id="s1", user="dana")
            )
            assert list(checks.checks) == []

            # The machine's own: a program without Origin, and a page by any loopback name.
            queued = await client.post(learning)
            assert queued.status_code == 202, queued.text
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
                assert (await client.get(SEAT + "diary", headers={"host": host})).status_code == 200, host
            done = await client.post(
                delete, data={"csrf": csrf}, headers={"host": f"localhost:{port}", "origin": f"http://localhost:{port}"}
            )
            assert done.status_code == 303, done.text
        assert not await note_exists(inspector, "acme", "ana", written.note.id)


async def test_local_mode_takes_no_change_from_a_page_on_another_loopback_port(
    make_settings, dsn, local_embedder, edge_index
):
    """A page on this machine but at another origin (a dev server or a notebook on another port, the
    same port by another loopback name, https) is another site to the browser and to local mode: its
    POST is refused before the route runs, on the sessions API and the inspector alike, while a page
    of this very origin, a program without ``Origin`` and a GET from anywhere local are served."""
    clock = ManualClock(NOW)
    async with open_inspector(
        inspector_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local"
    ) as inspector:
        written, sessions = await _a_note_and_a_session(inspector, clock)
        port = int(inspector.base_url.rsplit(":", 1)[1])
        other = 3000 if port != 3000 else 3001
        assert inspector.base_url == f"http://127.0.0.1:{port}"  # the Host every request below carries
        learning = "/api/sessions/s1/learning?company=acme&user=dana"
        delete = f"{SEAT}diary/{written.note.id}/delete"
        async with inspector.client() as client:
            csrf = csrf_of((await client.get(SEAT + "diary")).text)
            for origin in (
                f"http://127.0.0.1:{other}",
                f"http://localhost:{other}",
                f"http://localhost:{port}",
                f"http://[::1]:{port}",
                f"https://127.0.0.1:{port}",
            ):
                post = await client.post(learning, headers={"origin": origin})
                assert (post.status_code, post.json()["error"]["reason"]) == (403, "ORIGIN_NOT_SAME"), origin
                form = await client.post(delete, data={"csrf": csrf}, headers={"origin": origin})
                assert (form.status_code, form.json()["error"]["reason"]) == (403, "ORIGIN_NOT_SAME"), origin
                read = await client.get(learning, headers={"origin": origin})
                assert read.status_code == 200 and read.json()["checks"] == [], origin
                assert (await client.get(SEAT + "diary", headers={"origin": origin})).status_code == 200, origin
            assert await note_exists(inspector, "acme", "ana", written.note.id)
            checks = await sessions.ListLearningChecks(
                ss_pb.ListLearningChecksRequest(company="acme", session_id="s1", user="dana")
            )
            assert list(checks.checks) == []

            same = await client.post(learning, headers={"origin": f"http://127.0.0.1:{port}"})
            assert same.status_code == 202 and same.json()["reused"] is False, same.text
            again = await client.post(learning)  # no Origin: a program, served
            assert again.status_code == 200 and again.json()["reused"] is True, again.text
            done = await client.post(delete, data={"csrf": csrf}, headers={"origin": f"http://127.0.0.1:{port}"})
            assert done.status_code == 303, done.text
        assert not await note_exists(inspector, "acme", "ana", written.note.id)


async def test_the_seats_page_degrades_and_says_so_when_the_event_log_cannot_be_read(
    make_settings, dsn, local_embedder, edge_index
):
    """The telemetry service is down (nothing listens at its address): the company page still lists
    the seats the episodes know, with their health, and says what it could not read."""
    from services.runner.registry import SERVICES

    settings = inspector_settings(
        make_settings, services={"telemetry": "127.0.0.1:1"}, inspector={"rpc_timeout_seconds": 3}
    )
    names = [n for n in SERVICES if n != "telemetry"]
    clock = ManualClock(NOW)
    async with open_inspector(
        settings, dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local", names=names
    ) as inspector:
        await ep_grpc.EpisodeServiceStub(inspector.channel).RecordEpisode(
            ep_pb.RecordEpisodeRequest(
                company="acme",
                seat="ana",
                turn_id="t-1",
                label="Message",
                outcome=ep_pb.TURN_OUTCOME_DONE,
                start_time=Timestamp(seconds=int(NOW.timestamp()) - 60),
                end_time=Timestamp(seconds=int(NOW.timestamp())),
            )
        )
        async with inspector.client() as client:
            page = await client.get("/inspector/c/acme/")
            assert page.status_code == 200
            assert "The event log could not be read" in page.text
            assert re.search(r"<th scope=\"row\"><a href=\"/inspector/c/acme/s/ana/\">ana</a></th>", page.text)
            overview = await client.get(SEAT)
            assert (
                overview.status_code == 200
                and text_of(overview.text).count("The telemetry service did not answer.") == 2
            )


async def test_a_sessions_page_lists_the_latest_thirty_checks(make_settings, dsn, local_embedder, edge_index):
    """Spec "Visibility": the Learning disclosure lists the latest 30 checks — the sessions' own
    page, not the inspector's 25-row pages of everything else."""
    clock = ManualClock(NOW)
    async with open_inspector(
        inspector_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index, auth_mode="local"
    ) as inspector:
        _, sessions = await _a_note_and_a_session(inspector, clock)
        made = []
        for i in range(35):  # 35 plan milestones, 35 queued checks
            clock.advance(minutes=1)
            saved = await sessions.SavePlan(
                ss_pb.SavePlanRequest(
                    company="acme",
                    session_id="s1",
                    user="dana",
                    revision=i + 1,
                    steps=[
                        ss_pb.PlanStep(id=f"s{j}", title=f"step {j}", status=ss_pb.STEP_STATUS_DONE)
                        for j in range(i + 1)
                    ],
                )
            )
            made.append(saved.queued_check.check_id)
        async with inspector.client() as client:
            page = await client.get("/inspector/c/acme/sessions/s1")
    assert page.status_code == 200
    shown = re.findall(r'id="check-([0-9a-f-]+)"', page.text)
    assert shown == list(reversed(made))[:30]
