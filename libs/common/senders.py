"""Who sent a message of a turn's trigger, defined once for the server (issue 13): prefetch reads
the senders as counterparties, the reflector's profiler as the people it profiles. Each adds the
key it files a sender under (they differ, and each is stored). The Python client
(clients/python) keeps its own: it is shipped apart and imports no server code."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Sender", "key_part", "parse_subject_part", "subject_part"]

# The characters that structure a key naming a sender (``<work>:<worker>:<platform>/<id>``), escaped
# in each part so that no platform or identifier ("MS Teams", "a:b/c") can make a key ambiguous. Every
# other character stands for itself: a key of a platform and id with none of these reads as before.
_ESCAPES = {"%": "%25", "/": "%2F", ":": "%3A"}
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}
_ESCAPED = re.compile("%(25|2F|3A)")


@dataclass(frozen=True)
class Sender:
    """A sender: a handle, or a platform's id of an external person, and how they are shown."""

    handle: str = ""
    external_id: str = ""
    platform: str = ""
    display_name: str = ""

    @property
    def name(self) -> str:
        """How the sender is shown: the display name, else the handle, else the external id."""
        return self.display_name or self.handle or self.external_id


def key_part(value: str) -> str:
    """``value`` as one part of a key: ``%``, ``/`` and ``:`` percent-escaped, nothing else changed."""
    return "".join(_ESCAPES.get(c, c) for c in value)


def subject_part(platform: str, ident: str) -> str:
    """The part of a key naming a sender: ``<platform>/<handle or external id>``, each escaped
    (:func:`key_part`), so the part holds no ``:`` and exactly one ``/``."""
    return f"{key_part(platform)}/{key_part(ident)}"


def parse_subject_part(part: str) -> tuple[str, str] | None:
    """The (platform, identifier) a :func:`subject_part` names, as given to it; None for a string
    no :func:`subject_part` makes (a ``:``, not exactly one ``/``, a ``%`` that escapes nothing)."""
    if ":" in part or part.count("/") != 1:
        return None
    platform, ident = (_unescape(x) for x in part.split("/"))
    if not platform or not ident:
        return None
    return platform, ident


def _unescape(value: str) -> str | None:
    if "%" in _ESCAPED.sub("", value):  # a "%" that escapes nothing: no key_part made this
        return None
    return _ESCAPED.sub(lambda m: _UNESCAPES[m.group(0)], value)
