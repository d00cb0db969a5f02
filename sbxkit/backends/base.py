"""The runner interface: what one-shot runs and the CLI need from an execution backend.

Two backends implement it:

- ``sbxkit.backends.docker.DockerBackend`` — the hardened container of design.md §3, a thin
  adapter over ``sbxkit.runner.run`` (the create body and the lifecycle are that function's,
  byte for byte).
- ``sbxkit.backends.sbx.SbxBackend`` — a Docker Sandboxes microVM driven through the ``sbx``
  CLI (docs/adr-sbx.md).

A backend's life: ``preflight()`` once when it starts (not at the first run: a missing binary
or engine fails the start, not a run an hour later), then ``reconcile_orphans()``, then any
number of ``run_once()`` calls (concurrently if the caller likes), then ``aclose()``.
``open_backend`` does exactly that around a block.

Sessions (``open_sandbox``), the PTY shell, file grants and harness batches stay Docker-only:
they are written against the engine, not against this interface.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import trio

from sbxkit.result import RunResult
from sbxkit.spec import SandboxSpec

__all__ = ["Backend", "open_backend"]

CLOSE_BUDGET_S = 60.0
"""How long ``open_backend`` gives ``aclose`` when the block ends (shielded)."""


class Backend(Protocol):
    """One way of running a spec once and guaranteeing its sandbox is removed."""

    @property
    def kind(self) -> str:
        """``"docker"`` or ``"sandbox"`` (the profile's ``sandbox.runtime``)."""
        ...

    async def preflight(self) -> None:
        """Check, when the runner starts, that the backend can run anything at all.

        Raises an ``SbxError`` subclass naming what is missing (the ``sbx`` binary, the
        Docker engine). Idempotent.
        """
        ...

    async def run_once(self, spec: SandboxSpec, stdin: bytes | None = None) -> RunResult:
        """Run ``spec.command`` once in a fresh sandbox, remove the sandbox, return the result.

        Refused input raises ``SpecError`` before anything is created. The sandbox is removed
        however the run ends (exit, timeout, overflow, error, the caller's cancellation); a
        removal that cannot be confirmed raises a ``CleanupError``.
        """
        ...

    async def reconcile_orphans(self) -> list[str]:
        """Remove what earlier lives of this runner left behind; return what was removed."""
        ...

    async def aclose(self) -> None:
        """Release what ``preflight`` acquired. Runs must have finished. Idempotent."""
        ...


B = TypeVar("B", bound=Backend)


@asynccontextmanager
async def open_backend(backend: B) -> AsyncIterator[B]:
    """Preflight and reconcile ``backend``, yield it, and close it however the block ends."""
    try:
        await backend.preflight()
        await backend.reconcile_orphans()
        yield backend
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_BUDGET_S):
            await backend.aclose()
