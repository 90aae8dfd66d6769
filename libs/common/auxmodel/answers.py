"""Reading a model's answer: the JSON object a prompt asked for, or :class:`InvalidOutput`."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

__all__ = ["InvalidOutput", "described", "digest", "parse_object"]

_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


class InvalidOutput(Exception):
    """The model answered something that is not what the prompt asked for.

    Its message never quotes the answer: it is logged and kept in a worker's failure, where no
    erasure reaches, and a model's prose quotes the person it was asked about (:func:`described`)."""


def digest(text: str) -> str:
    """A short digest of ``text`` (``sha256:`` and 12 hex digits): enough to tell two texts apart
    or find one again in the rows that keep it, without putting the text (a message, a person's
    handle) in a log line or an exception."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def described(text: str) -> str:
    """A model's answer or a person's words as a log line may name them: length and digest."""
    return f"{len(text)} chars, {digest(text)}"


def parse_object(text: str) -> dict[str, Any]:
    """A JSON object from a model's answer (a fenced block is accepted); else InvalidOutput."""
    body = _FENCE.sub("", text.strip())
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise InvalidOutput(f"no JSON object in the answer ({described(text)})")
    try:
        value = json.loads(body[start : end + 1])
    except json.JSONDecodeError as exc:
        raise InvalidOutput(f"invalid JSON: {exc}") from exc
    except RecursionError:
        # Nested deeper than the interpreter's recursion limit (about 1000 levels): no prompt asks
        # for that, and the reader must say "invalid", not crash its caller.
        raise InvalidOutput("the JSON is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise InvalidOutput("the answer is not a JSON object")
    return value
