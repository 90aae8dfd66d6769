"""The HTTP API over real HTTP (uvicorn on a loopback port, httpx): GET the receipts (the same as
ListLearningChecks), POST a manual check with the chat scope, a stranger's 404 that says nothing,
authentication refusals, and the OpenAPI document that every answer conforms to.

The caller is authenticated by the real middleware (``libs.common.auth.HttpAuthMiddleware``,
tokens mode) with real tokens issued into the test's database; "local" stands for a caller bound
to no company (another service, with the deployment's internal secret)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from google.protobuf import json_format
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from starlette.middleware import Middleware

from agentlearn.sessions.v1 import session_service_pb2 as pb
from libs.common.auth import INTERNAL_HEADER, Authenticator, HttpAuthMiddleware
from libs.common.httpserver import start_http
from services.sessions.http import OPENAPI
from tests.support.sessions import open_sessions, result, user, verification

GRANTS = {
    "dana-chat": ("acme", "dana", ["chat"]),
    "dana-read": ("acme", "dana", ["memory:read"]),
    "mallory-chat": ("acme", "mallory", ["chat"]),
    "acme-inspect": ("acme", None, ["inspect"]),
    "globex-chat": ("globex", "dana", ["chat"]),
    "dana-chat-at-ben": ("acme", "dana", ["chat"], "ben"),  # bound to seat ben too (the sessions are ana's)
}
HEADERS: dict[str, dict[str, str]] = {}


def _auth(name: str) -> dict[str, str]:
    return HEADERS[name]


@pytest.fixture
async def api(make_settings, dsn, edge_index, clock):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        infra = env.app.infra
        for name, (company, who, scopes, *seat) in GRANTS.items():
            token, _ = await infra.tokens.issue(company, scopes, user=who, seat=seat[0] if seat else None)
            HEADERS[name] = {"Authorization": f"Bearer {token}"}
        HEADERS["local"] = {INTERNAL_HEADER: infra.internal_secret}
        authenticator = Authenticator(
            infra.tokens, clock, mode="tokens", cache_seconds=0, internal_secret=infra.internal_secret
        )
        routes = env.app.components["sessions"].http_routes
        auth = Middleware(HttpAuthMiddleware, authenticator=authenticator, public=("/api/openapi.json",))
        server = await start_http(routes, "127.0.0.1", 0, middleware=[auth])
        try:
            async with httpx.AsyncClient(base_url=f"http://{server.address}", timeout=30) as client:
                yield env, client
        finally:
            await server.stop()


async def _session(env, clock, session="s1"):  # type: ignore[no-untyped-def]
    t = clock.now()
    await env.append(
        session,
        user(f"{session}-u", "RAW-USER-WORDS", t),
        result(f"{session}-r", "make", "RAW-TOOL-OUTPUT", t),
        verification(f"{session}-v", "pytest", "42 passed", t),
    )


def _conforms(body: dict, path: str, method: str, status: int) -> None:
    """``body`` is what the OpenAPI document says this answer is (its refs resolved in the document)."""
    schema = OPENAPI["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]
    registry = Registry().with_resource("urn:openapi", DRAFT202012.create_resource(OPENAPI))
    resolved = json.loads(json.dumps(schema).replace('"#/components/', '"urn:openapi#/components/'))
    jsonschema.Draft202012Validator(resolved, registry=registry).validate(body)


LEARNING = "/api/sessions/{session_id}/learning"


async def test_get_returns_the_receipts_exactly_as_list_learning_checks(api, clock):
    env, client = api
    await _session(env, clock)
    await env.manual("s1")
    await env.drain()
    clock.advance(minutes=1)
    await env.manual("s1")  # a second one, still queued
    resp = await client.get("/api/sessions/s1/learning", headers=_auth("dana-chat"))
    assert resp.status_code == 200
    body = resp.json()
    grpc_view = await env.stub.ListLearningChecks(
        pb.ListLearningChecksRequest(company="acme", session_id="s1", user="dana")
    )
    assert body == {
        **json_format.MessageToDict(grpc_view, preserving_proto_field_name=True),
        "next_page_token": "",
    }
    assert [c["state"] for c in body["checks"]] == ["CHECK_STATE_QUEUED", "CHECK_STATE_COMPLETED"]
    assert "RAW-USER-WORDS" not in resp.text and "RAW-TOOL-OUTPUT" not in resp.text  # never raw evidence
    _conforms(body, LEARNING, "get", 200)
    paged = await client.get("/api/sessions/s1/learning?page_size=1", headers=_auth("dana-chat"))
    assert len(paged.json()["checks"]) == 1 and paged.json()["next_page_token"]
    inspector = await client.get("/api/sessions/s1/learning?user=dana", headers=_auth("acme-inspect"))
    assert inspector.status_code == 200 and len(inspector.json()["checks"]) == 2


async def test_post_queues_a_manual_check_with_the_chat_scope_and_reuses_a_queued_one(api, clock):
    env, client = api
    await _session(env, clock)
    first = await client.post("/api/sessions/s1/learning", headers=_auth("dana-chat"))
    assert first.status_code == 202 and first.json()["reused"] is False
    _conforms(first.json(), LEARNING, "post", 202)
    again = await client.post("/api/sessions/s1/learning", headers=_auth("dana-chat"))
    assert again.status_code == 200 and again.json()["reused"] is True
    assert again.json()["check"]["check_id"] == first.json()["check"]["check_id"]
    _conforms(again.json(), LEARNING, "post", 200)
    (check,) = await env.checks("s1")
    assert check.trigger == pb.CHECK_TRIGGER_MANUAL and check.check_id == first.json()["check"]["check_id"]
    refused = await client.post("/api/sessions/s1/learning", headers=_auth("dana-read"))
    assert refused.status_code == 403 and refused.json()["error"]["reason"] == "SCOPE_MISSING"
    assert (await client.get("/api/sessions/s1/learning", headers=_auth("dana-read"))).status_code == 403
    assert len(await env.checks("s1")) == 1


async def test_a_stranger_gets_the_same_404_as_for_a_session_that_does_not_exist(api, clock):
    env, client = api
    await _session(env, clock)
    for method in ("get", "post"):
        theirs = await client.request(method.upper(), "/api/sessions/s1/learning", headers=_auth("mallory-chat"))
        none = await client.request(method.upper(), "/api/sessions/s0/learning", headers=_auth("mallory-chat"))
        assert theirs.status_code == none.status_code == 404
        assert theirs.text == none.text.replace("s0", "s1")
        _conforms(theirs.json(), LEARNING, method, 404)
    assert await env.checks("s1") == []  # the stranger's POST queued nothing


async def test_a_token_bound_to_another_seat_gets_the_same_404_for_the_users_own_session(api, clock):
    env, client = api
    await _session(env, clock)  # dana's session with seat ana
    for method in ("get", "post"):
        theirs = await client.request(method.upper(), "/api/sessions/s1/learning", headers=_auth("dana-chat-at-ben"))
        none = await client.request(method.upper(), "/api/sessions/s0/learning", headers=_auth("dana-chat-at-ben"))
        assert theirs.status_code == none.status_code == 404
        assert theirs.text == none.text.replace("s0", "s1")
    assert await env.checks("s1") == []  # the POST queued nothing for seat ana


async def test_who_may_call(api, clock):
    env, client = api
    await _session(env, clock)
    anonymous = await client.get("/api/sessions/s1/learning")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["status"] == "UNAUTHENTICATED"
    other_user = await client.get("/api/sessions/s1/learning?user=erin", headers=_auth("dana-chat"))
    assert other_user.status_code == 403 and other_user.json()["error"]["reason"] == "CREDENTIAL_SCOPE_MISMATCH"
    other_company = await client.get("/api/sessions/s1/learning", headers=_auth("globex-chat"))
    assert other_company.status_code == 404  # globex has no session s1
    local = await client.get("/api/sessions/s1/learning", headers=_auth("local"))
    assert local.status_code == 400 and local.json()["error"]["field_violations"][0]["field"] == "company"
    named = await client.post("/api/sessions/s1/learning?company=acme&user=dana", headers=_auth("local"))
    assert named.status_code == 202
    bad = await client.get("/api/sessions/s1/learning?page_size=-1", headers=_auth("dana-chat"))
    assert bad.status_code == 400 and bad.json()["error"]["reason"] == "PAGE_SIZE_INVALID"


async def test_the_openapi_document_is_served_and_names_every_route(api):
    env, client = api
    resp = await client.get("/api/openapi.json")
    assert resp.status_code == 200 and resp.json() == json.loads(json.dumps(OPENAPI))
    doc = resp.json()
    assert doc["openapi"].startswith("3.1")
    routes = {r.path for r in env.app.components["sessions"].http_routes}
    assert routes == set(doc["paths"])
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            assert op["operationId"] and op["responses"], (path, method)
    # Every schema in the document is itself a valid JSON Schema.
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
