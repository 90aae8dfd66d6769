"""Reading a model's answer: the JSON object a prompt asked for, or :class:`InvalidOutput`."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["InvalidOutput", "parse_object"]

_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


class InvalidOutput(Exception):
    """The model answered something that is not what the prompt asked for."""


def parse_object(text: str) -> dict[str, Any]:
    """A JSON object from a model's answer (a fenced block is accepted); else InvalidOutput."""
    body = _FENCE.sub("", text.strip())
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise InvalidOutput(f"no JSON object in the answer: {text[:200]!r}")
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
