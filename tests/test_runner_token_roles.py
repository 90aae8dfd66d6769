"""``./run token`` as deploy.md's application role (no DDL right), the way an operator mints the
first token on Kubernetes: ``kubectl exec`` in a service pod, or deploy/k8s-optional/token-job.yaml.
It must not try to migrate there (that is the migrate Job's, with its own role): it checks the schema
and says in one line when it is behind, and otherwise issues, lists and revokes."""

from __future__ import annotations

import argparse
import re
import uuid
from collections.abc import Callable

import asyncpg
import pytest

from libs.common.config import Settings
from libs.common.db import COMMON_MIGRATIONS, migrate
from libs.common.infra import SchemaBehind
from services.runner.security import run_token
from tests.support.databases import admin_execute, scratch_database


def _as(dsn: str, role: str) -> str:
    return re.sub(r"^postgresql://[^@]*@", f"postgresql://{role}@", dsn)


def _args(command: str, **kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"seat": None, "user": None, "name": "", "ttl_days": None, "company": None}
    return argparse.Namespace(token_command=command, **{**base, **kw})


async def test_the_application_role_issues_and_lists_tokens_once_the_migrate_role_migrated(
    pg_uri: str, make_settings: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    mig, app = f"agl_mig_{suffix}", f"agl_app_{suffix}"
    await admin_execute(pg_uri, f"CREATE ROLE {mig} LOGIN", f"CREATE ROLE {app} LOGIN")
    try:
        async with scratch_database(pg_uri, "roles") as db:
            name = db.split("?")[0].rsplit("/", 1)[1]
            await admin_execute(pg_uri, f"GRANT CREATE ON DATABASE {name} TO {mig}")
            # What deploy.md has the DBA do: the extension, DDL for the migrate role, DML for the app.
            conn = await asyncpg.connect(db)
            try:
                for sql in (
                    "CREATE EXTENSION IF NOT EXISTS vector",
                    "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
                    f"GRANT CREATE, USAGE ON SCHEMA public TO {mig}",
                    f"GRANT USAGE ON SCHEMA public TO {app}",
                    f"ALTER DEFAULT PRIVILEGES FOR ROLE {mig} IN SCHEMA public "
                    f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app}",
                    f"ALTER DEFAULT PRIVILEGES FOR ROLE {mig} IN SCHEMA public "
                    f"GRANT USAGE, SELECT ON SEQUENCES TO {app}",
                ):
                    await conn.execute(sql)
            finally:
                await conn.close()

            settings = make_settings(
                database_url=_as(db, app), database={"migrate_on_start": False, "statement_cache_size": 0}
            )
            # Before the migrate Job: one line naming ./run migrate, not a privilege traceback.
            with pytest.raises(SchemaBehind, match=r"run \./run migrate") as behind:
                await run_token(settings, _args("list"))
            assert "\n" not in str(behind.value)

            await migrate(_as(db, mig), [COMMON_MIGRATIONS])
            capsys.readouterr()
            assert await run_token(settings, _args("issue", company="acme", seat="ana", scopes="memory:read")) == 0
            token = capsys.readouterr().out.strip()
            assert token.startswith("agl_")
            assert await run_token(settings, _args("list", company="acme")) == 0
            listed = capsys.readouterr().out
            assert "live" in listed and "company=acme seat=ana" in listed and token not in listed
            assert await run_token(settings, _args("revoke", token_id=listed.split()[0])) == 0
    finally:
        await admin_execute(pg_uri, f"DROP ROLE IF EXISTS {app}", f"DROP ROLE IF EXISTS {mig}")
