"""The session-learning HTTP API (spec "Visibility"), on the same service object as the gRPC one.

    GET  /api/sessions/{session_id}/learning   the receipts (ListLearningChecks as JSON)
    POST /api/sessions/{session_id}/learning   queue a manual check (CheckRecentWork); needs `chat`
    GET  /api/openapi.json                     this API's OpenAPI 3.1 document

Who is calling: ``request.state.principal`` when the authentication middleware set one, else
``libs.common.auth.current_principal()`` (ANONYMOUS outside an authenticated request: refused with
401). The company and the user are the principal's; a principal bound to none (local mode, a
company-wide token) names them with the ``company`` and ``user`` query parameters, and a token is
refused (403) for a company or user it is not bound to. A session the user does not own is 404
with the same body as one that does not exist. Raw evidence is never returned.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import asyncpg
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentlearn.sessions.v1 import session_service_pb2 as pb
from libs.common.auth import Principal, current_principal
from libs.common.errors import AgentLearnError, InvalidArgument, PermissionDenied
from services.sessions.domain import DOMAIN
from services.sessions.service import SessionService
from services.sessions.servicer import check_to_pb

__all__ = ["OPENAPI", "routes"]

_log = logging.getLogger(__name__)
_STORE_DOWN = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError, OSError, TimeoutError)
"""The store could not be reached: the service's trouble, not the caller's (503, retryable)."""
_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 409,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
}
READ_SCOPES = ("chat", "inspect")
"""A receipt is readable with ``chat`` (the session's own user) or ``inspect`` (the inspector)."""


def _error(status: int, code: str, reason: str, message: str, metadata: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {
            "error": {
                "code": status,
                "status": code,
                "reason": reason,
                "domain": DOMAIN,
                "message": message,
                "metadata": metadata or {},
            }
        },
        status_code=status,
    )


def _from(err: AgentLearnError) -> JSONResponse:
    code = err.code.name
    body = _error(_HTTP_STATUS.get(code, 500), code, err.reason, err.message, dict(err.metadata))
    if err.violations:
        payload = json.loads(bytes(body.body))
        payload["error"]["field_violations"] = [
            {"field": v.field, "description": v.description} for v in err.violations
        ]
        return JSONResponse(payload, status_code=body.status_code)
    return body


def _principal(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    return principal if isinstance(principal, Principal) else current_principal()


def _who(request: Request, principal: Principal) -> tuple[str, str]:
    """The company and user of the request: the principal's, else the query's (then checked
    against the principal's binding)."""
    q = request.query_params
    company = principal.company or q.get("company", "")
    user = principal.user or q.get("user", "")
    if not company:
        raise InvalidArgument(
            "company is required (a query parameter when the credential names none)",
            reason="FIELD_REQUIRED",
            domain=DOMAIN,
            field="company",
        )
    if not user:
        raise InvalidArgument(
            "user is required (a query parameter when the credential names none)",
            reason="FIELD_REQUIRED",
            domain=DOMAIN,
            field="user",
        )
    principal.check(q.get("company") or company, user=q.get("user") or user)
    return company, user


def _check_json(check: Any) -> dict[str, Any]:
    return json_format.MessageToDict(check_to_pb(check), preserving_proto_field_name=True)


def routes(service: SessionService) -> list[Route]:
    async def learning(request: Request) -> JSONResponse:
        principal = _principal(request)
        if principal.kind == "anonymous":
            return _error(401, "UNAUTHENTICATED", "CREDENTIAL_MISSING", "a bearer token is required")
        session_id = request.path_params["session_id"]
        try:
            company, user = _who(request, principal)
            if request.method == "POST":
                if not principal.allows("chat"):
                    raise PermissionDenied(
                        "queueing a learning check needs the chat scope",
                        reason="SCOPE_MISSING",
                        domain=DOMAIN,
                        metadata={"scope": "chat"},
                    )
                check, reused = await service.check_recent_work(company, session_id, user)
                return JSONResponse({"check": _check_json(check), "reused": reused}, status_code=200 if reused else 202)
            if not any(principal.allows(s) for s in READ_SCOPES):
                raise PermissionDenied(
                    "reading learning receipts needs the chat or inspect scope",
                    reason="SCOPE_MISSING",
                    domain=DOMAIN,
                    metadata={"scope": "chat"},
                )
            try:
                size = int(request.query_params.get("page_size", "0") or 0)
            except ValueError:
                raise InvalidArgument(
                    "page_size must be an integer", reason="PAGE_SIZE_INVALID", domain=DOMAIN, field="page_size"
                ) from None
            checks, token = await service.list_checks(
                company, session_id, user, size, request.query_params.get("page_token", "")
            )
            body = json_format.MessageToDict(
                pb.ListLearningChecksResponse(checks=[check_to_pb(c) for c in checks], next_page_token=token),
                preserving_proto_field_name=True,
            )
            body.setdefault("checks", [])
            body.setdefault("next_page_token", "")
            return JSONResponse(body)
        except AgentLearnError as err:
            return _from(err)
        except _STORE_DOWN as err:
            _log.warning("sessions HTTP %s %s: store unavailable: %s", request.method, request.url.path, err)
            return _error(503, "UNAVAILABLE", "STORE_UNAVAILABLE", "the session store is unavailable; retry")
        except Exception:
            _log.exception("sessions HTTP %s %s failed", request.method, request.url.path)
            return _error(500, "INTERNAL", "INTERNAL", "internal error; see the server log")

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(OPENAPI)

    return [
        Route("/api/sessions/{session_id}/learning", learning, methods=["GET", "POST"]),
        Route("/api/openapi.json", openapi, methods=["GET"]),
    ]


# ------------------------------------------------------------------------------ the OpenAPI document

_SCALAR = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_INT32: {"type": "integer"},
    FieldDescriptor.TYPE_INT64: {"type": "string", "description": "int64, as a JSON string"},
}
"""The JSON mapping of the scalar types our receipts use (an int64 is a string in proto JSON); a
field of another type fails the import, to be added here."""


def _schema(message: Any) -> dict[str, Any]:  # a Descriptor: the stubs type DESCRIPTOR as Python|upb
    """The JSON schema of ``message`` as ``json_format.MessageToDict`` prints it (proto field names):
    an object naming only its fields, an enum by the names of its values but UNSPECIFIED (an unset
    enum is left out), a Timestamp as an RFC 3339 string."""
    return {
        "type": "object",
        "properties": {f.name: _field_schema(f) for f in message.fields},
        "additionalProperties": False,
    }


def _field_schema(field: FieldDescriptor) -> dict[str, Any]:
    if field.message_type is not None and field.message_type.full_name == "google.protobuf.Timestamp":
        one: dict[str, Any] = {"type": "string", "format": "date-time"}
    elif field.message_type is not None:
        one = _schema(field.message_type)
    elif field.enum_type is not None:
        one = {"type": "string", "enum": [v.name for v in field.enum_type.values if v.number != 0]}
    else:
        one = _SCALAR[field.type]
    return {"type": "array", "items": one} if field.is_repeated else one


_PARAMS = [
    {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}},
    {
        "name": "company",
        "in": "query",
        "required": False,
        "description": "The company, when the credential is bound to none (local mode).",
        "schema": {"type": "string"},
    },
    {
        "name": "user",
        "in": "query",
        "required": False,
        "description": "The session's owner, when the credential is bound to no user.",
        "schema": {"type": "string"},
    },
]
_ERROR = {
    "description": "An error (google.rpc.Status in JSON form, with ErrorInfo's reason and domain).",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_ERRORS = {code: _ERROR for code in ("400", "401", "403", "404")}
_CHECK_REF = {"$ref": "#/components/schemas/LearningCheck"}
_CHECK_REPLY = {"check": _CHECK_REF, "reused": {"type": "boolean"}}


def _json_object(description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A response whose body is a JSON object with every one of ``properties`` present."""
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "agentlearn session learning",
        "version": "1",
        "description": "Receipts of a chat session's learning checks, and the manual check "
        "(spec/session-learning.txt). Authenticated with a bearer token (`Authorization: Bearer <token>`); "
        "raw evidence is never returned.",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "LearningCheck": {
                **_schema(pb.LearningCheck.DESCRIPTOR),
                "description": "The receipt of one learning check (agentlearn.sessions.v1.LearningCheck in JSON: "
                "enums by name, fields not set left out).",
                "required": ["check_id", "session_id", "trigger", "state"],
            },
            "Error": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {
                            "code": {"type": "integer"},
                            "status": {"type": "string"},
                            "reason": {"type": "string"},
                            "domain": {"type": "string"},
                            "message": {"type": "string"},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "field_violations": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {"field": {"type": "string"}, "description": {"type": "string"}},
                                },
                            },
                        },
                        "required": ["code", "status", "reason", "message"],
                    }
                },
                "required": ["error"],
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/api/sessions/{session_id}/learning": {
            "get": {
                "operationId": "listLearningChecks",
                "summary": "The session's learning checks, newest first (30 by default).",
                "description": "Needs the chat or inspect scope. A session the caller's user does not own is 404, "
                "exactly as one that does not exist.",
                "parameters": [
                    *_PARAMS,
                    {
                        "name": "page_size",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0, "maximum": 100, "default": 30},
                    },
                    {"name": "page_token", "in": "query", "required": False, "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": _json_object(
                        "The receipts.",
                        {"checks": {"type": "array", "items": _CHECK_REF}, "next_page_token": {"type": "string"}},
                    ),
                    **_ERRORS,
                },
            },
            "post": {
                "operationId": "checkRecentWork",
                "summary": "Queue a manual learning check (Check recent work).",
                "description": "Needs the chat scope. A queued or running check of the session is returned instead "
                "of adding another (200, reused true); a new one is 202.",
                "parameters": _PARAMS,
                "responses": {
                    "202": _json_object("A new check was queued.", _CHECK_REPLY),
                    "200": _json_object("The session's queued or running check, reused.", _CHECK_REPLY),
                    **_ERRORS,
                },
            },
        },
        "/api/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document.",
                "security": [],
                "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {}}}},
            }
        },
    },
}
