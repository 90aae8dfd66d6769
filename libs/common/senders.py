"""Who sent a message of a turn's trigger, defined once for the server (issue 13): prefetch reads
the senders as counterparties, the reflector's profiler as the people it profiles. Each adds the
key it files a sender under (they differ, and each is stored). The Python client
(clients/python) keeps its own: it is shipped apart and imports no server code."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Sender"]


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
