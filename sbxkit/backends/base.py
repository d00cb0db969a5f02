"""The backend interface: what every consumer needs from an execution backend.

Two backends implement it:

- ``sbxkit.backends.docker.DockerBackend`` — the hardened container (docs/security.md): the plan
  (``sbxkit._plan.plan``) and the one owned-container lifecycle (``sbxkit._lifecycle.owned``).
- ``sbxkit.backends.sbx.SbxBackend`` — a Docker Sandboxes microVM driven through the ``sbx``
  CLI (docs/adr-sbx.md).

A backend's life: ``preflight()`` once when it starts (not at the first run: a missing binary
or engine fails the start, not a run an hour later), then ``reconcile_orphans()``, then any
number of ``run_once()``/``own()`` calls (concurrently if the caller likes), then ``aclose()``.
``open_backend`` does exactly that around a block.

Every consumer goes through a backend: one-shot runs (``run_once``), and sessions, PTYs,
stdio workers, grants and harness batches (``own``: a planned, created, verified container for
the block, removed when it ends). A backend that cannot serve a consumer refuses it in ``check``
— at plan time, before anything is created — with a ``SpecError`` naming the runtime
(``refuse``); the sbx backend serves one-shot runs and batches only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol, TypeVar

import trio

from sbxkit._model.result import RunResult, Stream
from sbxkit._model.spec import SandboxSpec
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit.errors import SpecError

if TYPE_CHECKING:  # the Docker primitives; a backend module imports this one, not the reverse
    from sbxkit._lifecycle.owned import OwnedContainer
    from sbxkit._plan.plan import CheckedSpec

__all__ = ["CONSUMERS", "Backend", "Consumer", "open_backend", "refuse"]

Consumer = Literal["run", "session", "pty", "stdio", "grants", "harness"]
"""Who asks for a sandbox: a one-shot run, a session (exec, files), a PTY, a stdio worker,
a file-grants run, a harness batch."""
CONSUMERS: tuple[Consumer, ...] = ("run", "session", "pty", "stdio", "grants", "harness")


def refuse(kind: str, consumer: Consumer, served: Sequence[Consumer], why: str) -> NoReturn:
    """The plan-time refusal of a consumer this backend cannot serve."""
    raise SpecError(
        "sandbox.runtime",
        f"the {kind!r} runtime cannot serve {consumer} sandboxes ({why}); it serves "
        f'{", ".join(served)}; use runtime = "docker" for {consumer}',
    )


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

    def check(self, spec: SandboxSpec | CheckedSpec, consumer: Consumer) -> CheckedSpec:
        """Validate ``spec`` once for ``consumer``; refuse a consumer this backend cannot
        serve (``refuse``). Pure: nothing is contacted or created."""
        ...

    def own(
        self,
        spec: SandboxSpec | CheckedSpec,
        consumer: Consumer,
        *,
        command: Sequence[str] | None = None,
        body_overrides: Mapping[str, Any] | None = None,
    ) -> AbstractAsyncContextManager[OwnedContainer]:
        """A planned, created and verified (still stopped) container for the block, removed
        through its owner when the block ends; a removal failure raises ``CleanupError``."""
        ...

    async def run_once(
        self,
        spec: SandboxSpec | CheckedSpec,
        stdin: StdinSource | None = None,
        *,
        on_output: Callable[[Stream, bytes], object] | None = None,
    ) -> RunResult:
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


publish(__name__, globals())  # public names show as sbxkit.NAME
