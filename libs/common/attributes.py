"""The ``agentlearn.*`` attributes of spans and metrics, named once: a turn's trace and a metric's
series are searchable by the same keys (``agentlearn.company``, ``agentlearn.seat``,
``agentlearn.turn_id``, ...) whichever service recorded them.
"""

from __future__ import annotations

from opentelemetry.util.types import AttributeValue

__all__ = ["PREFIX", "agentlearn_attributes"]

PREFIX = "agentlearn."


def agentlearn_attributes(**values: AttributeValue) -> dict[str, AttributeValue]:
    """``{"agentlearn.<name>": value}`` for each keyword, in the order given."""
    return {PREFIX + name: value for name, value in values.items()}
