"""The environment a run is judged under: this process's, or its caller's.

A run reads a few variables from its environment when it is planned (``SBXKIT_ENV``,
``SBXKIT_EVIDENCE``, ``SBXKIT_LABELS``, ``SBXKIT_NETWORK_AUDIT_LOG``: ``plan.effective_settings``)
and ``sbxkit run --env NAME`` passes a variable by name. In the caller's own process that is
``os.environ``. When ``sbxkit run`` hands its run to the supervisor (``sbxkit.handoff``), the
supervisor plans it under the environment the command line was started with: the variables
the caller sent, set here for the task serving that run (a context variable, so concurrent
runs each see their own caller's, and nothing else of the supervisor's process leaks in).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["caller_environ", "caller_environ_bytes", "judged_under"]

_CALLER: ContextVar[Mapping[str, str] | None] = ContextVar("sbxkit_caller_environ", default=None)


def caller_environ() -> Mapping[str, str]:
    """The environment this run is judged under (text values)."""
    given = _CALLER.get()
    return os.environ if given is None else given


def caller_environ_bytes(key: str) -> bytes | None:
    """One variable as bytes (``SBXKIT_ENV`` is judged byte for byte: a value that is not
    UTF-8 is an error where it matters). A caller's variables are text already."""
    given = _CALLER.get()
    if given is None:
        return os.environb.get(key.encode())
    value = given.get(key)
    return None if value is None else value.encode()


@contextmanager
def judged_under(environ: Mapping[str, str]) -> Iterator[None]:
    """Judge the runs of this task (and the tasks it starts) under ``environ``. A task started
    meanwhile keeps a copy of this context (a pool's keeper may live for minutes): the values
    are emptied when the block ends, so none of the caller's outlives its run."""
    given = dict(environ)
    token = _CALLER.set(given)
    try:
        yield
    finally:
        given.clear()
        _CALLER.reset(token)
