"""Reading the LoCoMo data the same way in every benchmark that uses it: a conversation's turns in
session order with their session's date, a question's evidence turn ids, a turn written as a note."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["evidence_ids", "note_text", "turn_texts", "turns_of"]


def note_text(turn: dict[str, Any], date: str | None, with_date: bool, with_caption: bool) -> str:
    """``speaker: text``, with ``[date]`` before it and ``[shares caption]`` after it as asked."""
    text = f"{turn['speaker']}: {turn['text']}"
    if with_date and date:
        text = f"[{date}] {text}"
    if with_caption and turn.get("blip_caption"):
        text = f"{text} [shares {turn['blip_caption']}]"
    return text


def turns_of(conv: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """The conversation's dialog turns in session order, each with its session's date."""
    sessions = sorted(
        (int(m.group(1)), k) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)) and isinstance(conv[k], list)
    )
    return [(conv.get(f"session_{n}_date_time"), t) for n, k in sessions for t in conv[k]]


def evidence_ids(raw: list[str]) -> list[str]:
    """The dialog ids a question's evidence names (``D1:3``, ``D:1:3`` and lists of them), once each."""
    out = []
    for item in raw:
        for part in re.split(r"[;,\s]+", str(item)):
            part = re.sub(r"^D:", "D", part.strip())
            if part:
                out.append(part)
    return list(dict.fromkeys(out))


def turn_texts(data: list[dict[str, Any]]) -> list[str]:
    """Every dialog turn of every conversation as ``speaker: text`` (no date, no caption), in the
    file's order: the plain texts the load experiments write and embed."""
    return [
        f"{t['speaker']}: {t['text']}"
        for conv in data
        for k, v in conv["conversation"].items()
        if k.startswith("session_") and isinstance(v, list)
        for t in v
    ]
