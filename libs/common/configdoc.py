"""Renders ``docs/configuration.md`` from the config models, so the page lists every knob with its
default and the rule behind it and cannot drift from the code (``tests/test_docs.py`` checks it).

    .venv/bin/python -m libs.common.configdoc > docs/configuration.md
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel, SecretStr

from libs.common.config import Settings

__all__ = ["missing_descriptions", "render"]

_HEAD = """# Configuration

One YAML file (`--config`, or `$AGENTLEARN_CONFIG`) plus environment overrides, read once at start.
Precedence, highest first: the environment, the YAML file, the defaults below. Any knob can be set
from the environment as `AGENTLEARN_<PATH>` with `__` between levels, e.g.
`AGENTLEARN_LEARNING__DIARY__LONG_CAP_PER_SEAT=800`. The conventional names `DATABASE_URL`,
`QDRANT_URL`, `QDRANT_API_KEY`, `OPENAI_BASE_URL` + `OPENAI_API_KEY` (+ `OPENAI_MODEL`,
`OPENAI_EMBEDDINGS_MODEL`) are honoured too; that endpoint (provider `openai`) goes at the head of
the configured `providers.auxiliary_chain` (`["openai", "offline"]` when none is configured; an
`AGENTLEARN_PROVIDERS__AUXILIARY_CHAIN` sets the chain exactly). Unknown knobs are refused at
start, not ignored; the variables agentlearn's clients read (`AGENTLEARN_ADDRESS`, `AGENTLEARN_REFLECTOR_ADDRESS`,
`AGENTLEARN_TOKEN`, `AGENTLEARN_COMPANY`, `AGENTLEARN_SEAT`, `AGENTLEARN_ROLE`,
`AGENTLEARN_UNIT_CHAIN`, `AGENTLEARN_TLS_CA`, `AGENTLEARN_PROTOS`) are not knobs and are skipped.
An example file: `config/agentlearn.example.yaml`.

This page is generated from `libs/common/config.py` (`python -m libs.common.configdoc`); a test
fails when it is out of date. Defaults are the spec's; where the spec names a knob without a
number, the description says what was chosen.
"""


def _default(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "(secret)"
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, dict):
        return "`{}`" if not value else "`" + json.dumps(sorted(value)) + "` (names)"
    if isinstance(value, list):
        return "`" + json.dumps(value) + "`"
    return f"`{value}`"


_Section = tuple[str, type[BaseModel], str]
"""A nested model to document as its own section: (path, model, what it is)."""


def _rows(model: type[BaseModel], prefix: str, out: list[tuple[str, str, str]], sections: list[_Section]) -> None:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        default = field.get_default(call_default_factory=True)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sections.append((path, annotation, (field.description or "").strip()))
            continue
        desc = " ".join((field.description or "").split())
        out.append((path, _default(default), desc))
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is dict and len(args) == 2 and issubclass(args[1], BaseModel):
            # A mapping of named sections (roles by name, providers by name): document one entry.
            sections.append((f"{path}.<name>", args[1], ""))


def render() -> str:
    lines = [_HEAD]
    pending: list[tuple[str, type[BaseModel], str]] = [("", Settings, "Top level.")]
    while pending:
        prefix, model, about = pending.pop(0)
        rows: list[tuple[str, str, str]] = []
        nested: list[_Section] = []
        _rows(model, f"{prefix}." if prefix else "", rows, nested)
        if rows:
            lines.append(f"\n## `{prefix or '(top level)'}`\n")
            if about:
                lines.append(" ".join(about.split()) + "\n")
            if model.__doc__ and prefix:
                doc = " ".join(model.__doc__.split())
                if doc and doc != " ".join(about.split()):
                    lines.append(doc + "\n")
            lines.append("| knob | default | what it does (the rule behind it) |")
            lines.append("|---|---|---|")
            for path, default, desc in rows:
                lines.append(f"| `{path}` | {default} | {desc.replace('|', '/')} |")
        pending[0:0] = nested
    return "\n".join(lines) + "\n"


def missing_descriptions() -> list[str]:
    missing: list[str] = []
    pending: list[tuple[str, type[BaseModel]]] = [("", Settings)]
    while pending:
        prefix, model = pending.pop()
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                pending.append((path + ".", field.annotation))
            elif not field.description:
                missing.append(path)
    return missing


if __name__ == "__main__":
    print(render(), end="")
