"""The inspector in a real browser: Debian's Chromium driven by Playwright (no browser download),
one browser for the whole test session, against the seeded company served by the app ``./run up``
serves. A person signs in by pasting a token, clicks seat → skill → version diff → rollback,
approves a proposal, deletes a note (htmx's live search and confirm dialogs on the way), and does
the same without JavaScript; each result is checked through gRPC. The main pages are also checked
for labels, landmarks, the keyboard, and a phone's width.

``AGENTLEARN_INSPECTOR_SCREENSHOTS=docs`` saves screenshots of the main pages there (the PNGs in
docs/ come from that)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from tests.test_inspector_support import BODY_V1, seeded_env

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HAVE_CHROMIUM = Path(CHROMIUM).exists()
SHOTS = os.environ.get("AGENTLEARN_INSPECTOR_SCREENSHOTS", "")
SEAT = "/inspector/c/acme/s/ana/"
SHOT_PAGES = {"company", "seat", "diary", "skill", "episode", "proposals", "reflections", "session", "drafts"}
"""The pages docs/inspector.md shows."""


@pytest.fixture(scope="session")
async def browser():
    if not HAVE_CHROMIUM:
        pytest.fail("the browser tests need Debian's chromium at /usr/bin/chromium (./run test installs it)")
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture(scope="module")
async def env(pg_uri, template_db, tmp_path_factory, local_embedder):
    async with seeded_env(pg_uri, template_db, tmp_path_factory.mktemp("inspector-browser"), local_embedder) as pair:
        yield pair


async def sign_in(browser: Browser, inspector, *scopes: str, js: bool = True, width: int = 1200) -> Page:  # type: ignore[no-untyped-def]
    """A fresh browser context that pasted a token into the sign-in form."""
    context = await browser.new_context(java_script_enabled=js, viewport={"width": width, "height": 900})
    context.set_default_timeout(20_000)
    page = await context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm asks; the person agrees
    await page.goto(inspector.base_url + "/")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.get_by_label("Token").fill(await inspector.token("acme", *scopes))
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Seats of acme")).to_be_visible()
    return page


async def test_seat_skill_version_diff_and_rollback(browser, env):
    inspector, seeded = env
    page = await sign_in(browser, inspector, "inspect", "memory:write")
    try:
        await page.get_by_role("link", name="ana", exact=True).first.click()
        await expect(page.get_by_role("heading", name="ana", exact=True)).to_be_visible()
        await page.get_by_role("navigation", name="Seat").get_by_role("link", name="Skills").click()
        await page.get_by_role("link", name="deploy-checklist").click()
        await expect(page.get_by_role("heading", name="deploy-checklist")).to_be_visible()
        await page.get_by_label("From version").select_option("1")
        await page.get_by_label("to version").select_option("3")
        await page.get_by_role("button", name="Compare").click()
        diff = page.get_by_role("table", name="Changes from version 1 to version 3")
        await expect(diff).to_be_visible()
        await expect(diff.get_by_role("row").filter(has_text="Announce in #releases")).to_contain_text("added")
        await expect(diff.get_by_role("row").filter(has_text="2. Run the smoke tests.")).to_contain_text("removed")
        await page.get_by_role("button", name="Roll back to 1").click()
        await expect(page.get_by_role("status")).to_contain_text("rolled back")
        await expect(page.locator("#skill-version")).to_have_text("4")
    finally:
        await page.context.close()
    got = await inspector.skills.GetSkill(sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=seeded.skill_id))
    assert got.skill.version == 4 and got.skill.body == BODY_V1
    versions = await inspector.skills.ListSkillVersions(
        sk_pb.ListSkillVersionsRequest(company="acme", seat="ana", skill_id=seeded.skill_id)
    )
    live = versions.versions[0]
    assert live.current and live.change == sk_pb.SKILL_CHANGE_ROLLED_BACK and live.restored_from_version == 1


async def test_approve_a_proposal_with_its_evidence_in_view(browser, env):
    inspector, seeded = env
    page = await sign_in(browser, inspector, "admin")
    try:
        await page.goto(inspector.base_url + SEAT)
        await page.get_by_role("navigation", name="Seat").get_by_role("link", name="Proposals").click()
        card = page.locator(f"#proposal-{seeded.proposal_id}")
        await expect(card.get_by_role("list", name="Cited evidence")).to_contain_text("plan:2:s3")
        await card.get_by_label("Why (optional)").first.fill("Keys rotate every quarter")
        await card.get_by_role("button", name="Approve “rotate-api-keys”").click()
        await expect(page.get_by_role("status")).to_contain_text("approved")
    finally:
        await page.context.close()
    listed = await inspector.skills.ListSkillProposals(
        sk_pb.ListSkillProposalsRequest(company="acme", seat="ana", state=sk_pb.PROPOSAL_STATE_APPROVED)
    )
    (approved,) = listed.proposals
    assert approved.id == seeded.proposal_id and approved.decision_reason == "Keys rotate every quarter"
    assert approved.decided_by.startswith("inspector (token:")
    live = await inspector.skills.GetSkill(
        sk_pb.GetSkillRequest(company="acme", seat="ana", skill_name="rotate-api-keys")
    )
    assert live.skill.id == approved.skill_id


async def test_search_the_diary_as_you_type_and_delete_a_note(browser, env):
    inspector, seeded = env
    page = await sign_in(browser, inspector, "inspect", "memory:write")
    try:
        await page.goto(inspector.base_url + SEAT + "diary")
        await page.get_by_label("Search notes").press_sequentially("merge freeze")
        # htmx replaces the results as one types: the freeze note leads, without a page load.
        rows = page.get_by_role("table", name="Notes").get_by_role("row")
        await expect(rows.nth(1)).to_contain_text("Merge freeze this week")
        assert "q=merge" in page.url
        await rows.nth(1).get_by_role("button", name="Delete note: Merge freeze this week").click()
        await expect(page.get_by_role("status")).to_contain_text("deleted")
        await expect(page.get_by_text("Merge freeze this week")).to_have_count(0)
    finally:
        await page.context.close()
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await inspector.diary.GetNote(
            diary_pb.GetNoteRequest(company="acme", seat="ana", note_id=seeded.notes["freeze"])
        )
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    kept = await inspector.diary.GetNote(
        diary_pb.GetNoteRequest(company="acme", seat="ana", note_id=seeded.notes["bob"])
    )
    assert kept.note.content.startswith("Bob wants")


async def test_every_page_works_without_javascript(browser, env):
    inspector, seeded = env
    page = await sign_in(browser, inspector, "inspect", "memory:write", js=False)
    try:
        await page.get_by_role("link", name="ana", exact=True).first.click()
        await page.get_by_role("navigation", name="Seat").get_by_role("link", name="Skills").click()
        await page.get_by_label("Find a skill").fill("triage")
        await page.get_by_role("button", name="Search").click()
        await expect(page.get_by_role("link", name="deploy-checklist")).to_have_count(0)
        await page.get_by_role("link", name="triage-tickets").click()
        await page.get_by_role("button", name="Pin").click()
        await expect(page.get_by_role("status")).to_contain_text("pinned")
        await expect(page.locator("#skill-state")).to_contain_text("pinned")
        await page.get_by_role("navigation", name="Seat").get_by_role("link", name="Episodes").click()
        await page.get_by_label("Kind").select_option("compacted")
        await page.get_by_role("button", name="Search").click()
        await page.locator("ol.cards h2 a").first.click()
        await expect(page.get_by_role("heading", name="Exemplars")).to_be_visible()
        await expect(page.locator(".exemplar")).to_have_count(len(seeded.exemplars))
    finally:
        await page.context.close()
    got = await inspector.skills.GetSkill(
        sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=seeded.other_skill_id)
    )
    assert got.skill.pinned


MAIN_PAGES = [
    ("company", "/inspector/c/acme/"),
    ("seat", SEAT),
    ("diary", SEAT + "diary"),
    ("episodes", SEAT + "episodes"),
    ("skills", SEAT + "skills"),
    ("proposals", SEAT + "proposals?state=all"),
    ("profiles", SEAT + "profiles"),
    ("reflections", SEAT + "reflections"),
    ("events", SEAT + "events"),
    ("sessions", "/inspector/c/acme/sessions"),
    ("drafts", "/inspector/c/acme/drafts"),
]

UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea, button')]
  .filter(el => el.type !== 'hidden')
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !(el.textContent || '').trim())
  .map(el => el.outerHTML)"""


async def test_main_pages_are_labelled_navigable_by_keyboard_and_fit_a_phone(browser, env):
    inspector, seeded = env
    pages = [
        *MAIN_PAGES,
        ("skill", f"{SEAT}skills/{seeded.skill_id}?a=2&b=3"),
        ("episode", f"{SEAT}episodes/{seeded.compacted_id}"),
        ("session", f"/inspector/c/acme/sessions/{seeded.session_id}"),
    ]
    for width in (1200, 390):
        page = await sign_in(browser, inspector, "admin", width=width)
        try:
            for name, path in pages:
                await page.goto(inspector.base_url + path)
                assert await page.evaluate(UNLABELLED) == [], name
                assert await page.locator("main#main").count() == 1 and await page.locator("header").count() == 1, name
                assert await page.locator("h1").count() == 1, name
                for chart in await page.locator("svg[role=img]").all():
                    assert (await chart.locator(":scope > title").text_content() or "").strip(), name
                # Nothing but a table's own scroll region is wider than the screen.
                assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), (
                    name,
                    width,
                )
                if SHOTS and width == 1200 and name in SHOT_PAGES:
                    await page.screenshot(path=f"{SHOTS}/inspector-{name}.png", full_page=True)
                if SHOTS and width == 390 and name == "seat":
                    await page.screenshot(path=f"{SHOTS}/inspector-phone.png", full_page=True)
            # The keyboard: the first Tab reaches "Skip to content", Enter moves focus into main.
            await page.goto(inspector.base_url + SEAT)
            await page.keyboard.press("Tab")
            assert await page.evaluate("document.activeElement.textContent.trim()") == "Skip to content"
            await page.keyboard.press("Enter")
            assert await page.evaluate("document.activeElement.id") == "main"
        finally:
            await page.context.close()
