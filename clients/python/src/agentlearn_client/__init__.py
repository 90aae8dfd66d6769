"""agentlearn's gRPC client: the generated stubs live in ``agentlearn.<service>.v1``; this package
adds the turn lifecycle (:class:`AgentLearn`) and the decoding of rich errors."""

from agentlearn_client._client import (
    RETRY_SERVICE_CONFIG,
    AgentLearn,
    Message,
    Outcome,
    Sender,
    ToolResult,
    TurnContext,
)
from agentlearn_client._errors import ErrorDetails, error_details

__all__ = [
    "RETRY_SERVICE_CONFIG",
    "AgentLearn",
    "ErrorDetails",
    "Message",
    "Outcome",
    "Sender",
    "ToolResult",
    "TurnContext",
    "error_details",
]
