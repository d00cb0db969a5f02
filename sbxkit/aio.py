"""sbxkit for asyncio callers: await a sandboxed run from an asyncio program.

    import asyncio, sbxkit.aio

    async def main() -> None:
        task = asyncio.create_task(sbxkit.aio.run(spec))
        ...
        task.cancel()          # the container is removed before the task finishes cancelling

    asyncio.run(main())

sbxkit is trio code. Calling it as ``asyncio.to_thread(trio.run, sbxkit.run, spec)`` works but
leaks the sandbox's lifetime: cancelling the asyncio task abandons the thread, and the container
runs on until its payload ends. Here each call runs in a trio thread (``sbxkit._util.portal``), and
cancelling the awaiting task cancels the trio call and waits for its cleanup — the container's
removal — before ``CancelledError`` propagates. ``asyncio.timeout`` works the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sbxkit._consumers import oneshot
from sbxkit._consumers.harness import Job, JobResult
from sbxkit._consumers.harness import run_many as _harness_run_many
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._util.portal import Portal
from sbxkit._util.unwrap import plain_async

_run_many = plain_async(_harness_run_many)

__all__ = ["call", "run", "run_many"]

T = TypeVar("T")


async def call(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` where ``fn`` is trio code (any sbxkit coroutine function, or your
    own that uses ``sbxkit.open_sandbox``); cancellation reaches it as trio cancellation."""
    with Portal() as portal:
        return await portal.acall(fn, *args)


async def run(spec: SandboxSpec, stdin: bytes | None = None, **options: Any) -> RunResult:
    """``sbxkit.run`` for asyncio; ``options`` are its keyword arguments."""
    return await call(functools.partial(oneshot.run, spec, stdin, **options))


async def run_many(jobs: Sequence[Job], **options: Any) -> list[JobResult]:
    """``sbxkit.run_many`` for asyncio; ``options`` are its keyword arguments."""
    return await call(functools.partial(_run_many, jobs, **options))
