"""The translation of a downstream refusal into our own error root so it passes through unchanged.

A builtin that calls another service answers the caller with that service's own status: the
diary's ``INVALID_ARGUMENT NOTE_TOO_LONG`` (its ErrorInfo reason, domain and metadata, and its
BadRequest field) reaches the engine exactly as the diary sent it.
"""

from __future__ import annotations

import grpc

from libs.common.embeddings import EmbeddingError
from libs.common.errors import AgentLearnError
from libs.common.status_details import passthrough as _passthrough
from libs.common.vectorindex import IndexUnavailable
from services.prefetch.domain import DOMAIN

__all__ = ["passthrough", "rpc_failure"]


_SOURCE_OF_BLOCK = {
    "similar_prior_work": "episodes",
    "personal_memory": "diary",
    "skills": "skills",
    "relevant_knowledge": "knowledge",
    "counterparty": "profiles",
    "onboarding": "prefetch",
}
"""The service a turn-start block reads, for a failure reported under the block's name."""


def rpc_failure(service: str, err: BaseException) -> str:
    """A short account of a failed read for the summary: ``"diary: UNAVAILABLE"``: always the
    service and a gRPC status code name, never an exception's text (an ``AioRpcError``'s is a
    multi-line Python repr, and an unknown exception's may carry anything). A block name is
    reported as the service behind the block."""
    service = _SOURCE_OF_BLOCK.get(str(service), str(service))
    if isinstance(err, grpc.aio.AioRpcError):
        code = err.code()
    elif isinstance(err, AgentLearnError):
        code = err.code
    elif isinstance(err, TimeoutError):
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    elif isinstance(err, OSError | IndexUnavailable | EmbeddingError):
        code = grpc.StatusCode.UNAVAILABLE
    else:
        code = grpc.StatusCode.INTERNAL  # a bug: the server log has the traceback
    return f"{service}: {code.name}"


def passthrough(service: str, err: grpc.aio.AioRpcError) -> AgentLearnError:
    """The downstream status as our error root, keeping its code, reason, domain, metadata and
    field violations (:func:`libs.common.status_details.passthrough`). A status with no ErrorInfo
    (the service was not reached at all) is reported under our domain as ``<SERVICE>_<CODE>``."""
    return _passthrough(err, domain=DOMAIN, service=service)
