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
