"""Which engine failures the CLI reports as refused input (exit 2) rather than as sbxkit's own
failure (70): the daemon answering the container create with a 4xx other than 409, in-process
(``EngineError``) or through the supervisor (``SupervisorError`` with code ``failed``)."""

from __future__ import annotations

from sbxkit.errors import (
    EngineError,
    SbxError,
    SupervisorError,
    create_refusal_in,
    is_refusal_status,
)


def is_daemon_refusal(error: SbxError) -> bool:
    """True when the daemon refused a container create as bad input."""
    if isinstance(error, EngineError):
        return "/containers/create" in error.path and is_refusal_status(error.status)
    if isinstance(error, SupervisorError) and error.code == "failed":
        return create_refusal_in(error.reason)
    return False
