"""Which container is a lease's, and removing it until the daemon confirms it gone.

One definition for both owners (``InProcessOwner`` and the supervisor): a container is a lease's
only when its ``sbxkit.lease`` label names that lease — and, when it is looked up rather than known
by id, when its name is the lease's name too (containers are owned by lease label, never by name
prefix: another tool's container may share a prefix). Removal retries with backoff until the daemon
says the container is gone: 404 is gone, 409 "removal already in progress" is not success, any other
error is retried; the caller bounds the whole loop with its own deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio

from sbxkit._plan.policy import LEASE_LABEL
from sbxkit.engine.client import Engine
from sbxkit.errors import NotFound, SbxError

FIRST_RETRY_S = 0.05


def carries_lease(labels: Mapping[str, str] | None, lease: str) -> bool:
    """The container's lease label names ``lease``."""
    return (labels or {}).get(LEASE_LABEL) == lease


def is_lease_container(
    labels: Mapping[str, str] | None, names: Sequence[str] | None, lease: str, name: str
) -> bool:
    """A container found by lookup is the lease's: its label and its name both say so."""
    return carries_lease(labels, lease) and name in [n.lstrip("/") for n in names or []]


async def find_lease_container(engine: Engine, lease: str, name: str) -> str | None:
    """The id of the container carrying this lease's label and name, if the daemon has one."""
    for summary in await engine.container_list(label=f"{LEASE_LABEL}={lease}"):
        if is_lease_container(summary.labels, summary.names, lease, name):
            return summary.id
    return None


class Removal:
    """What a bounded removal loop saw last (for the error when its deadline passes)."""

    def __init__(self) -> None:
        self.last_error: str | None = None


async def remove_until_gone(
    engine: Engine,
    lease: str,
    name: str,
    container_id: str | None,
    removal: Removal,
    *,
    ceiling_s: float,
) -> None:
    """Remove the lease's container (by id, or found by label and name when the id is unknown)
    and return once the daemon confirmed it gone. Never returns otherwise: bound it."""
    delay = FIRST_RETRY_S
    while True:
        try:
            target = container_id or await find_lease_container(engine, lease, name)
            if target is not None:
                await engine.container_remove(target)  # False (404): already gone
            return
        except NotFound:
            return
        except SbxError as exc:  # 409 "removal in progress" included: wait and re-check
            removal.last_error = str(exc)
        await trio.sleep(delay)
        delay = min(delay * 2, ceiling_s)


__all__ = [
    "Removal",
    "carries_lease",
    "find_lease_container",
    "is_lease_container",
    "remove_until_gone",
]
