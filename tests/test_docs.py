"""Docs that are generated or referenced stay true to the code."""

from __future__ import annotations

from pathlib import Path

from libs.common.config import load_settings
from libs.common.configdoc import missing_descriptions, render

ROOT = Path(__file__).resolve().parents[1]


def test_every_knob_says_what_it_does():
    assert missing_descriptions() == []


def test_configuration_page_is_current():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render(), "regenerate: .venv/bin/python -m libs.common.configdoc > docs/configuration.md"


def test_the_example_config_loads():
    settings = load_settings(ROOT / "config" / "agentlearn.example.yaml", env={})
    assert settings.company("acme").roles["noisy-bot"].learning_enabled is False


def test_security_page_lists_every_rpcs_scope_as_the_protos_declare():
    from libs.common.auth import scope_table

    page = (ROOT / "docs" / "security.md").read_text()
    begin, end = "<!-- scope-table:begin -->\n", "\n<!-- scope-table:end -->"
    embedded = page[page.index(begin) + len(begin) : page.index(end)]
    assert embedded == scope_table(), "regenerate the table: .venv/bin/python -m libs.common.auth"


def test_the_operations_page_lists_every_background_pass():
    """docs/operations.md's "Background passes" table names every pass the runner knows, once."""
    import re

    from services.runner.registry import PASSES

    page = (ROOT / "docs" / "operations.md").read_text()
    section = page[page.index("## Background passes") :]
    table = section[: section.index("\n\n", section.index("| pass |"))]
    listed = [n for row in table.splitlines()[2:] for n in re.findall(r"`([a-z-]+)`", row.split("|")[1])]
    assert sorted(listed) == sorted(PASSES)
