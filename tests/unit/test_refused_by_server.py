"""Which failures of a write mean "nothing of it was written" (the server answered the statement
with an error: write it another way) and which leave the outcome unknown (the connection went, an
operator ended the session, the caller was cancelled: the server may have committed it, so nothing
of it may be written again). The turn start's save and the reflector's close both decide by it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from libs.common.db import refused_by_server


@pytest.mark.parametrize(
    "err",
    [
        asyncpg.UniqueViolationError("duplicate key"),
        asyncpg.exceptions.DiskFullError("No space left on device"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
    ],
)
def test_an_error_the_server_answered_is_a_refusal(err: BaseException) -> None:
    assert refused_by_server(err)


@pytest.mark.parametrize(
    "err",
    [
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.InterfaceError("connection is closed"),
        ConnectionResetError(),
        asyncio.CancelledError(),
    ],
)
def test_a_lost_connection_an_operators_intervention_or_a_cancel_leaves_the_outcome_unknown(err: BaseException) -> None:
    assert not refused_by_server(err)
