"""Migrations and the release before them (docs/deploy.md, "Compatibility"): during a rolling
update the old pods run on the migrated schema, so a file that drops, renames or constrains what
older code may use has to say, in a ``-- rolling-update:`` comment, either why that is safe or that
the old pods must be stopped first, and the second kind is listed in deploy.md's "Upgrades that stop
the old pods first". The files that shipped before this rule are named here instead: they are
applied by name and never edited."""

from __future__ import annotations

import re
from pathlib import Path

from libs.common.db import COMMON_MIGRATIONS, Migrations
from services.runner.registry import SERVICES

ROOT = Path(__file__).resolve().parent.parent
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

# What can break a query of the release before: a name gone or changed, or a row it writes refused.
RISKY = re.compile(
    r"\b(DROP\s+(TABLE|INDEX|COLUMN|CONSTRAINT|VIEW|FUNCTION|TYPE|TRIGGER)|RENAME\b|"
    r"ALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b|SET\s+NOT\s+NULL|ADD\s+(CONSTRAINT|PRIMARY\s+KEY|UNIQUE|CHECK))",
    re.I,
)
MARKER = re.compile(r"^--\s*rolling-update:\s*(safe|stop old pods)\b", re.I | re.M)

# Shipped before the marker existed, reviewed once: dropping an index no query names, inside the
# migration that created it, or a constraint the release before already kept ("safe"); or breaking
# the release before ("stop", listed in deploy.md).
SHIPPED = {
    "diary/0003_fill_index.sql": "safe",  # drops an index only the planner used
    "knowledge/0001_knowledge_pages.sql": "safe",  # DROP INDEX IF EXISTS of its own, same file
    "reflector/0004_one_state.sql": "safe",  # a CHECK on the states of the machine it shipped with
    "reflector/0002_shared_queue.sql": "stop",
    "skills/0006_time_names.sql": "stop",
    "diary/0006_diary_requests.sql": "stop",
}


def _statements(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def verdict(sql: str) -> str | None:
    """``None`` when the file risks nothing; else its marker's ``safe``/``stop``, or ``missing``."""
    if not RISKY.search(_statements(sql)):
        return None
    marked = MARKER.search(sql)
    if marked is None:
        return "missing"
    return "safe" if marked.group(1).lower() == "safe" else "stop"


def _files() -> dict[str, str]:
    components: list[Migrations] = [COMMON_MIGRATIONS, *[m.MIGRATIONS for m in SERVICES.values()]]
    return {f"{c.component}/{p.name}": p.read_text() for c in components for _, p in c.files()}


def test_the_check_reads_statements_not_comments() -> None:
    assert verdict("CREATE TABLE t (id int);\n-- we never DROP TABLE here\n") is None
    assert verdict("ALTER TABLE t RENAME COLUMN a TO b;\n") == "missing"
    assert verdict("-- rolling-update: safe (nothing reads t yet)\nDROP TABLE t;\n") == "safe"
    assert verdict("-- rolling-update: stop old pods (they read a)\nALTER TABLE t DROP COLUMN a;\n") == "stop"
    assert verdict("ALTER TABLE t ALTER COLUMN a TYPE bigint;\n") == "missing"
    assert verdict("ALTER TABLE t ADD COLUMN a int;\nCREATE INDEX i ON t (a);\n") is None


def test_every_migration_that_could_break_the_release_before_says_what_it_does() -> None:
    files = _files()
    assert set(SHIPPED) <= set(files), "a grandfathered migration is gone?"
    unmarked = [name for name, sql in files.items() if name not in SHIPPED and verdict(sql) == "missing"]
    assert not unmarked, (
        f"{unmarked}: a DROP/RENAME/type change/constraint breaks the pods of the release before during a "
        "rolling update; add '-- rolling-update: safe (why)' or '-- rolling-update: stop old pods (why)' "
        "and list the second kind in docs/deploy.md"
    )


def test_deploy_md_lists_every_migration_that_needs_the_old_pods_stopped() -> None:
    doc = DEPLOY_DOC.read_text()
    section = doc.split("### Upgrades that stop the old pods first", 1)[1].split("\n## ", 1)[0]
    stops = {name for name, sql in _files().items() if SHIPPED.get(name, verdict(sql)) == "stop"}
    assert stops, "the shipped breaking migrations are listed"
    assert not [name for name in stops if f"`{name}`" not in section]
