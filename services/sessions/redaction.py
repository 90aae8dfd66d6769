"""Redaction of secrets from evidence excerpts, before any model sees them.

Each rule names what it replaces; a match becomes ``[REDACTED:<name>]`` so a reader (and the
review) sees that something was there and what kind of thing it was, never its value. The rules
run in order: whole blocks (private keys) first, then credentials inside URLs, bearer and basic
authorization headers, the well-known token formats, and last the generic ``password=...`` /
``"api_key": "..."`` assignments (whose value may already be a marker, which is left alone).

The list is data: ``RULES``. ``tests/test_sessions_redaction.py`` has a positive and a negative
case for each rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RULES", "Redacted", "marker", "redact"]


def marker(name: str) -> str:
    return f"[REDACTED:{name}]"


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    replace: Callable[[re.Match[str]], str]


def _whole(name: str) -> Callable[[re.Match[str]], str]:
    return lambda m: marker(name)


def _keep_prefix(name: str) -> Callable[[re.Match[str]], str]:
    """Keep group ``prefix`` (the header or the key's name), replace the value."""
    return lambda m: m.group("prefix") + marker(name)


def _value(unquoted: str) -> str:
    """The value of a ``key = value`` or ``--flag value``: quoted, everything up to its closing quote
    (spaces included: ``"correct horse battery staple"`` is one secret), or to the end of the line
    when the quote never closes there (an excerpt cut mid-value); unquoted, ``unquoted``. A value
    that is already a marker is left alone."""
    return (
        r"(?:(?P<q>[\"'])(?!\[REDACTED:)(?:\\.|(?!(?P=q))[^\\\n])+(?P=q)"
        r"|(?P<u>[\"'])(?!\[REDACTED:)(?:\\.|(?!(?P=u))[^\\\n])+$"
        rf"|(?!\[REDACTED:){unquoted})"
    )


def _keep_prefix_and_quotes(name: str) -> Callable[[re.Match[str]], str]:
    """Keep group ``prefix`` and the value's quotes (so JSON stays JSON), replace the value."""
    return lambda m: m.group("prefix") + (m.group("q") or m.group("u") or "") + marker(name) + (m.group("q") or "")


_SECRET_KEYS = (
    r"password|passwd|passphrase|secret|secret[_-]?key|api[_-]?key|apikey|access[_-]?key|access[_-]?token|"
    r"auth[_-]?token|refresh[_-]?token|private[_-]?key|token|credentials?"
)
# A name ending in one of the keys (DB_PASSWORD, OPENAI_API_KEY, client_secret, aws_secret_access_key),
# never one that only starts with one (max_tokens, tokenizer, password_reset).

RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
            r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.S,
        ),
        _whole("private_key"),
    ),
    # scheme://user:password@host — the credentials go, the scheme and host stay (they say what the
    # connection was to).
    Rule(
        "credentials",
        re.compile(r"(?P<prefix>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^\s:/@'\"]+:[^\s@'\"]+@"),
        lambda m: m.group("prefix") + marker("credentials") + "@",
    ),
    Rule(
        "bearer_token",
        re.compile(r"(?P<prefix>\bBearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.I),
        _keep_prefix("bearer_token"),
    ),
    Rule(
        "basic_auth",
        re.compile(r"(?P<prefix>\bAuthorization\s*[:=]\s*[\"']?Basic\s+)[A-Za-z0-9+/=]{8,}", re.I),
        _keep_prefix("basic_auth"),
    ),
    Rule("aws_access_key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), _whole("aws_access_key")),
    Rule(
        "github_token",
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b"),
        _whole("github_token"),
    ),
    Rule("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b"), _whole("gitlab_token")),
    Rule("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), _whole("slack_token")),
    Rule("stripe_key", re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}\b"), _whole("stripe_key")),
    Rule("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), _whole("google_api_key")),
    Rule("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), _whole("npm_token")),
    Rule("pypi_token", re.compile(r"\bpypi-AgE[A-Za-z0-9_-]{50,}"), _whole("pypi_token")),
    # OpenAI (sk-..., sk-proj-...), Anthropic (sk-ant-...) and the many keys shaped like them.
    Rule("api_key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), _whole("api_key")),
    Rule("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), _whole("jwt")),
    # key = value, key: value, "key": "value", KEY=value (env files, configs, JSON, --flag=value).
    Rule(
        "secret",
        re.compile(
            rf"""(?P<prefix>\b[\w.-]*?(?:{_SECRET_KEYS})(?:[_-]?id)?["']?\s*(?:=|:)\s*)"""
            + _value(r"""[^\s"',;}]{4,}"""),
            re.I | re.M,
        ),
        _keep_prefix_and_quotes("secret"),
    ),
    # --password value, --api-key value (a flag and its value separated by a space).
    Rule(
        "secret_flag",
        re.compile(rf"""(?P<prefix>--(?:{_SECRET_KEYS})\s+)""" + _value(r"""(?!-)[^\s"']{4,}"""), re.I | re.M),
        _keep_prefix_and_quotes("secret"),
    ),
)


@dataclass(frozen=True)
class Redacted:
    text: str
    count: int
    """How many secrets were replaced."""


def redact(text: str) -> Redacted:
    """``text`` with every secret the rules recognise replaced by its marker."""
    count = 0
    for rule in RULES:
        text, n = rule.pattern.subn(rule.replace, text)
        count += n
    return Redacted(text, count)
