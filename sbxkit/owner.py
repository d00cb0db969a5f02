"""The owner seam: who creates a sandbox's container and who guarantees its removal.

Every container sbxkit makes is created and removed through an ``Owner``. The runner never calls
the daemon's create or delete itself, so ownership can move out of the caller's process (the
supervisor) without touching the lifecycle.

``InProcessOwner`` owns containers from inside the caller's process. It survives timeouts,
errors and trio cancellation, but **not a killed caller**: if the process dies (SIGKILL, power
loss) between create and remove, the container stays. Use it only where a helper process cannot
run.
"""

from __future__ import annotations

from typing import Protocol

import trio

from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import CleanupError, Conflict, NotFound, SbxError
from sbxkit.policy import LEASE_LABEL


class Owner(Protocol):
    """Creates and removes a lease's container."""

    async def create(
        self, lease: str, name: str, body: ContainerCreate, *, lifetime_s: float
    ) -> str:
        """Create the stopped container; return its immutable id.

        ``lifetime_s`` is the backstop: an owner that can act on its own (the supervisor)
        removes the container once that long has passed since registration, whatever the
        caller does.

        Must run to completion even if the caller is cancelled meanwhile (the id must be known
        so the container can be removed); the caller then removes it.
        """
        ...

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        """Remove the lease's container (by id, or by name and lease label if the id is unknown).

        Returns only once the daemon confirmed removal or that it is gone; raises CleanupError
        otherwise. Must be called from a shielded scope.
        """
        ...


class InProcessOwner:
    """Owns containers from the calling process; does not survive the caller being killed."""

    def __init__(self, engine: Engine, *, remove_budget_s: float = 60.0) -> None:
        self._engine = engine
        self._remove_budget_s = remove_budget_s

    async def create(
        self, lease: str, name: str, body: ContainerCreate, *, lifetime_s: float
    ) -> str:
        # An in-process owner has no life of its own: lifetime_s is enforced by the runner's
        # timeout alone. Shielded: once the request may have reached the daemon, give up only
        # with the id in hand. The engine's own create deadline bounds this.
        # A cancel that arrived before we start is honoured: nothing is under way yet.
        await trio.lowlevel.checkpoint_if_cancelled()
        with trio.CancelScope(shield=True):
            container_id = await self._engine.container_create(body, name=name)
        return container_id

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self._remove_budget_s) as budget:
                error = await self._remove_until_gone(lease, name, container_id)
            if budget.cancelled_caught:
                raise CleanupError(
                    lease,
                    container_id,
                    f"not confirmed within {self._remove_budget_s:g} s "
                    f"(last error: {error or 'none'})",
                )

    async def _remove_until_gone(
        self, lease: str, name: str, container_id: str | None
    ) -> str | None:
        """Retry removal with backoff until the daemon says the container is gone."""
        delay = 0.05
        last_error: str | None = None
        while True:
            try:
                target = container_id or await self._find_by_lease(lease, name)
                if target is not None:
                    await self._engine.container_remove(target)  # False (404) means gone too
                return last_error
            except Conflict as exc:
                # 409 "removal already in progress": not success; wait and re-check.
                last_error = str(exc)
            except NotFound:
                return last_error
            except SbxError as exc:
                last_error = str(exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _find_by_lease(self, lease: str, name: str) -> str | None:
        """The container carrying this lease's label and name, if the daemon has one."""
        found = await self._engine.container_list(label=f"{LEASE_LABEL}={lease}")
        for summary in found:
            labels = summary.labels or {}
            names = [n.lstrip("/") for n in summary.names or []]
            if labels.get(LEASE_LABEL) == lease and name in names:
                return summary.id
        return None
