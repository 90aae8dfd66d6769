"""What ``./run up`` and ``./run serve`` decide about security before they bind, and ``./run token``.

- Local mode is only for loopback: with ``auth.mode: auto`` a server bound to loopback runs
  without tokens (and says so in its ready line); on any other address it refuses to start with
  one line, because an open port with no authentication would let anyone who can reach it read,
  change or delete any company's memory. ``--require-auth`` (``auth.mode: tokens``) forces tokens
  on loopback too.
- The listeners: the public port (TLS with ``--tls-cert/--tls-key``) and, on Kubernetes, the
  internal mutual-TLS listener calls between services use.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import asyncpg
from pydantic import SecretStr

from libs.common.auth import MAX_TOKEN_TTL, SCOPES, Authenticator, TokenRecord, TokenStore, check_issue, is_loopback
from libs.common.clock import SystemClock
from libs.common.config import Settings
from libs.common.db import COMMON_MIGRATIONS, migrate, pending_migrations
from libs.common.errors import AgentLearnError
from libs.common.grpcserver import Listener
from libs.common.infra import SchemaBehind, resolve_dsn

__all__ = ["StartRefused", "add_token_parser", "auth_mode", "listeners", "run_token", "with_internal_secret"]


class StartRefused(Exception):
    """A one-line reason the server will not start."""


def auth_mode(settings: Settings) -> str:
    """``local`` or ``tokens`` for a server bound as ``settings.server`` says, or StartRefused."""
    if settings.auth.mode == "tokens":
        return "tokens"
    if is_loopback(settings.server.host):
        return "local"
    raise StartRefused(
        f"refusing to serve on {settings.server.host} without authentication: a non-loopback address "
        "needs auth.mode: tokens (or --require-auth) and tokens issued with ./run token issue"
    )


def with_internal_secret(settings: Settings) -> Settings:
    """Settings with the secret services present to each other: configured, or random for this
    process (split mode hands the parent's to its children)."""
    if settings.auth.internal_secret is not None:
        return settings
    secret = SecretStr(secrets.token_urlsafe(32))
    return settings.model_copy(update={"auth": settings.auth.model_copy(update={"internal_secret": secret})})


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise StartRefused(f"cannot read {what} {path}: {err.strerror}") from None


def listeners(settings: Settings) -> list[Listener]:
    server = settings.server
    if (server.tls_cert is None) != (server.tls_key is None):
        raise StartRefused("TLS needs both --tls-cert and --tls-key")
    out = [
        Listener(
            f"{server.host}:{server.port}",
            cert=_read(server.tls_cert, "the TLS certificate"),
            key=_read(server.tls_key, "the TLS key"),
        )
    ]
    if server.internal_port is not None:
        if not (server.internal_tls_cert and server.internal_tls_key and server.internal_tls_ca):
            raise StartRefused(
                "server.internal_port needs server.internal_tls_cert, internal_tls_key and internal_tls_ca "
                "(mutual TLS only)"
            )
        out.append(
            Listener(
                f"{server.host}:{server.internal_port}",
                cert=_read(server.internal_tls_cert, "the internal certificate"),
                key=_read(server.internal_tls_key, "the internal key"),
                client_ca=_read(server.internal_tls_ca, "the internal CA"),
            )
        )
    return out


def authenticator(settings: Settings, mode: str) -> Authenticator:
    secret = settings.auth.internal_secret
    return Authenticator(
        None,
        SystemClock(),
        mode=mode,
        cache_seconds=settings.auth.cache_seconds,
        internal_secret=secret.get_secret_value() if secret is not None else None,
    )


# --------------------------------------------------------------------------------------------
# ./run token issue | list | revoke
# --------------------------------------------------------------------------------------------


def add_token_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Callable[[argparse.ArgumentParser], None]
) -> None:
    token = sub.add_parser("token", help="issue, list and revoke caller tokens")
    tsub = token.add_subparsers(dest="token_command", required=True)
    issue = tsub.add_parser("issue", help="issue a token (printed once; only its digest is kept)")
    common(issue)
    issue.add_argument("--company", required=True, help="the company the token is bound to")
    issue.add_argument("--seat", help="bind the token to one seat (default: any seat of the company)")
    issue.add_argument("--user", help="bind the token to one user (default: any user of the company)")
    issue.add_argument(
        "--scopes", required=True, help="comma-separated: " + ", ".join(SCOPES) + " (admin implies every scope)"
    )
    issue.add_argument("--name", default="", help="a label for the operator (e.g. 'engine prod')")
    issue.add_argument(
        "--ttl-days", type=int, help="expire after this many days, at least 1 (omitted: the token never expires)"
    )
    listing = tsub.add_parser("list", help="list tokens (never their secrets)")
    common(listing)
    listing.add_argument("--company", help="only this company's tokens")
    revoke = tsub.add_parser("revoke", help="revoke a token by id (effective within auth.cache_seconds)")
    common(revoke)
    revoke.add_argument("token_id")
    for sp in (issue, listing, revoke):
        sp.set_defaults(log_level="WARNING")  # the output is the answer, not the store's chatter


def _scopes(args: argparse.Namespace) -> list[str]:
    return [s.strip() for s in args.scopes.split(",") if s.strip()]


def _ttl(args: argparse.Namespace) -> timedelta | None:
    """``--ttl-days N``; omitted is "never expires" (0 is not: it is refused, as a negative is)."""
    return timedelta(days=args.ttl_days) if args.ttl_days is not None else None


def _describe(r: TokenRecord) -> str:
    bound = f"company={r.company}" + (f" seat={r.seat}" if r.seat else "") + (f" user={r.user}" if r.user else "")
    state = "revoked" if r.revoke_time else ("expired" if r.expire_time and not r.live(SystemClock().now()) else "live")
    expires = r.expire_time.isoformat(timespec="seconds") if r.expire_time else "never"
    used = r.last_used_time.isoformat(timespec="seconds") if r.last_used_time else "never"
    return (
        f"{r.id}  {state:<7}  {bound}  scopes={','.join(r.scopes)}  name={r.name!r}  "
        f"created={r.create_time.isoformat(timespec='seconds')}  expires={expires}  last_used={used}"
    )


async def run_token(settings: Settings, args: argparse.Namespace) -> int:
    if args.token_command == "issue":
        # Checked before a database is started or reached: a refusal is one line in a moment.
        if args.ttl_days is not None and not 0 < args.ttl_days <= MAX_TOKEN_TTL.days:
            print(
                f"./run token issue: --ttl-days must be 1..{MAX_TOKEN_TTL.days} "
                "(omit it for a token that never expires)",
                file=sys.stderr,
            )
            return 2
        try:
            check_issue(args.company, _scopes(args), seat=args.seat, user=args.user, ttl=_ttl(args))
        except AgentLearnError as err:
            print(f"./run token issue: {err.message}", file=sys.stderr)
            return 2
    dsn = await resolve_dsn(settings)
    # As the services do: on Kubernetes (migrate_on_start false) this runs as the application role,
    # which has no DDL right, so it only checks the tokens' schema is there (the migrate Job's) and
    # says so in one line when it is not; migrating would fail on "permission denied for schema".
    cache = settings.database.statement_cache_size
    if settings.database.migrate_on_start:
        await migrate(dsn, [COMMON_MIGRATIONS])
    elif pending := await pending_migrations(dsn, [COMMON_MIGRATIONS], statement_cache_size=cache):
        raise SchemaBehind(
            f"the database schema is behind ({len(pending)} migrations pending, first {pending[0]}): "
            "run ./run migrate (database.migrate_on_start is false)"
        )
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, statement_cache_size=cache)
    assert pool is not None
    try:
        store = TokenStore(pool, SystemClock())
        if args.token_command == "issue":
            try:
                token, record = await store.issue(
                    args.company, _scopes(args), seat=args.seat, user=args.user, name=args.name, ttl=_ttl(args)
                )
            except AgentLearnError as err:
                print(f"./run token issue: {err.message}", file=sys.stderr)
                return 2
            print(token)
            print(f"# {_describe(record)}", file=sys.stderr)
            print("# the token is shown once; store it now (only its digest is kept)", file=sys.stderr)
            return 0
        if args.token_command == "list":
            for record in await store.list(args.company):
                print(_describe(record))
            return 0
        if await store.revoke(args.token_id):
            print(f"revoked {args.token_id}")
            return 0
        print(f"./run token revoke: no live token with id {args.token_id}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(Exception):
            await pool.close()
