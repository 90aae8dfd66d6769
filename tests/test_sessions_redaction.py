"""Redaction before any model sees evidence: every rule with a case it must catch and one it must
leave alone, and end to end that a secret recorded in a session never reaches the review call."""

from __future__ import annotations

import json

import pytest

from agentlearn.sessions.v1 import session_service_pb2 as pb
from services.sessions.redaction import RULES, redact
from tests.support.sessions import (
    is_review,
    open_sessions,
    prompt_text,
    result,
    scripted_llm,
    tool_request,
    user,
)

OPENAI_KEY = "sk-proj-Q9x2Lm4Pz8Rt6Vb1Nc3Kd5Wf7Hg0Js2A"
CASES = [
    # (rule, text with a secret, the secret, the marker, text that must stay as it is)
    (
        "private_key",
        "key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAEbm9uZQ\n"
        "-----END OPENSSH PRIVATE KEY-----\n",
        "b3BlbnNzaC1rZXktdjEAAAAA",
        "[REDACTED:private_key]",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
    ),
    (
        "credentials",
        "DATABASE_URL is postgresql://app_user:Tr0ub4dor&3@db.internal:5432/app",
        "Tr0ub4dor&3",
        "postgresql://[REDACTED:credentials]@db.internal:5432/app",
        "see https://docs.example.com/guide and postgres://db.internal:5432/app",
    ),
    (
        "bearer_token",
        'curl -H "Authorization: Bearer eyZ0aGlzLWlzLWEtdG9rZW4tdmFsdWU" https://api',
        "eyZ0aGlzLWlzLWEtdG9rZW4tdmFsdWU",
        "Bearer [REDACTED:bearer_token]",
        "the bearer of bad news",
    ),
    (
        "basic_auth",
        "Authorization: Basic YWRtaW46aHVudGVyMg==",
        "YWRtaW46aHVudGVyMg==",
        "Basic [REDACTED:basic_auth]",
        "Basic usage: run make",
    ),
    ("aws_access_key", "aws id AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "[REDACTED:aws_access_key]", "AKIA"),
    (
        "github_token",
        "GH token ghp_abcdefghijklmnopqrstuvwxyz0123456789 set",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "[REDACTED:github_token]",
        "ghp_short",
    ),
    (
        "gitlab_token",
        "glpat-AbCdEfGhIjKlMnOpQrSt12 in .netrc",
        "glpat-AbCdEfGhIjKlMnOpQrSt12",
        "[REDACTED:gitlab_token]",
        "glpat is the prefix",
    ),
    (
        "slack_token",
        "SLACK xoxb-123456789012-abcdefghijkl",
        "xoxb-123456789012-abcdefghijkl",
        "[REDACTED:slack_token]",
        "xox-box",
    ),
    (
        "stripe_key",
        "sk_live_51HxAbCdEfGhIjKlMn0p",
        "sk_live_51HxAbCdEfGhIjKlMn0p",
        "[REDACTED:stripe_key]",
        "sk_live_ is the prefix",
    ),
    (
        "google_api_key",
        "key=AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "[REDACTED:google_api_key]",
        "AIza is Google's prefix",
    ),
    (
        "npm_token",
        "//registry.npmjs.org/:_authToken npm_abcdefghijklmnopqrstuvwxyz0123456789",
        "npm_abcdefghijklmnopqrstuvwxyz0123456789",
        "[REDACTED:npm_token]",
        "npm_install",
    ),
    (
        "pypi_token",
        "password = pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcC1xcnN0LXV2d3h5ejAxMjM0NTY3",
        "pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcC1xcnN0LXV2d3h5ejAxMjM0NTY3",
        "[REDACTED:pypi_token]",
        "pypi-simple index",
    ),
    ("api_key", f"export OPENAI_API_KEY={OPENAI_KEY}", OPENAI_KEY, "[REDACTED:api_key]", "sk-learn is a library"),
    (
        "jwt",
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "[REDACTED:jwt]",
        "eyJ alone",
    ),
    (
        "secret",
        'DB_PASSWORD=hunter2hunter and {"client_secret": "c0ffee-beef-cafe"}',
        "hunter2hunter",
        "DB_PASSWORD=[REDACTED:secret]",
        "max_tokens: 4000, tokenizer: bert, pytest -k password_reset",
    ),
    (
        "secret_flag",
        "mysql --password Sup3rS3cret -h db",
        "Sup3rS3cret",
        "--password [REDACTED:secret]",
        "mysql --password-file ./pw -h db",
    ),
]


def test_every_rule_has_a_case():
    assert sorted(c[0] for c in CASES) == sorted(r.name for r in RULES)


@pytest.mark.parametrize("rule,text,secret,marker,benign", CASES, ids=[c[0] for c in CASES])
def test_each_rule_replaces_its_secret_with_a_marker_and_leaves_the_rest(rule, text, secret, marker, benign):
    out = redact(text)
    assert secret not in out.text and marker in out.text and out.count >= 1
    untouched = redact(benign)
    assert untouched.text == benign and untouched.count == 0


def test_a_secret_in_json_and_in_client_secret_is_caught():
    out = redact('{"client_secret": "c0ffee-beef-cafe", "api_key": "abcd1234efgh"}')
    assert "c0ffee-beef-cafe" not in out.text and "abcd1234efgh" not in out.text and out.count == 2


async def test_no_secret_reaches_the_review_and_redaction_comes_before_the_cap(
    make_settings, dsn, edge_index, clock, scripted_openai
):
    scripted_openai.chat_handler = lambda body: "{}"
    settings = make_settings(providers=scripted_llm(scripted_openai))
    # The key sits where the cap keeps the excerpt's tail: capped first, a fragment of it would
    # survive and no longer look like a key.
    long_tail = "A" * 2395 + " " + OPENAI_KEY
    async with open_sessions(settings, dsn, clock=clock, embedder=None, index=edge_index) as env:
        t = clock.now()
        await env.append(
            "s1",
            user("u1", f"my db is postgresql://app_user:Tr0ub4dor&3@db:5432/app and key {OPENAI_KEY}", t),
            tool_request("q1", "bash", 'curl -H "Authorization: Bearer eyZ0aGlzLWlzLWEtdG9rZW4tdmFsdWU" x', t),
            result("r1", "bash", long_tail, t),
            result("r2", "bash", "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", t),
        )
        await env.manual("s1")
        assert await env.drain() == 1
        (check,) = await env.checks("s1")
    reviews = [b for b in scripted_openai.received("chat") if is_review(b)]
    assert len(reviews) == 1
    sent = prompt_text(reviews[0])
    for secret in (OPENAI_KEY, OPENAI_KEY[-12:], "Tr0ub4dor&3", "eyZ0aGlzLWlzLWEtdG9rZW4tdmFsdWU", "MIIEpAIBAAKCAQEA"):
        assert secret not in sent and secret not in json.dumps(reviews[0])
    for marker in ("[REDACTED:api_key]", "[REDACTED:credentials]", "[REDACTED:bearer_token]", "[REDACTED:private_key]"):
        assert marker in sent
    assert check.evidence.redactions == 5 and check.evidence.truncated_excerpts == 1
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY


@pytest.mark.parametrize(
    "text,secret,kept",
    [
        ('{"password": "correct horse battery staple"}', "horse", '{"password": "[REDACTED:secret]"}'),
        ('{"client_secret": "abc def"}', "abc def", '{"client_secret": "[REDACTED:secret]"}'),
        ('password="my pass phrase" user=bob', "pass phrase", 'password="[REDACTED:secret]" user=bob'),
        ("api_key: 'sk live abc'", "sk live", "api_key: '[REDACTED:secret]'"),
        ('--password "correct horse battery staple" -h db', "horse", '--password "[REDACTED:secret]" -h db'),
        ('{"token": "a\\"b c", "n": 1}', "b c", '{"token": "[REDACTED:secret]", "n": 1}'),
        # An excerpt cut inside the value: the rest of its line is the value.
        ('password="correct horse batt\nnext line', "horse", 'password="[REDACTED:secret]\nnext line'),
    ],
)
def test_a_quoted_secret_is_redacted_whole_spaces_and_all(text, secret, kept):
    """A quoted value runs to its closing quote: stopping at the first space (or needing four
    characters before it) left the rest of a passphrase, or all of a short one, in the excerpt."""
    out = redact(text)
    assert secret not in out.text and out.text == kept and out.count == 1


def test_an_empty_quoted_value_is_not_a_secret_and_does_not_swallow_the_line():
    text = '{"password": "", "user": "bob"}'
    assert redact(text).text == text
