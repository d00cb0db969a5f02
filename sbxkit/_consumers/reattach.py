"""``attach_sandbox``: continue a detached session in this process (issue 40).

The handle (handle.py) names the lease, its supervisor and the session's plan. The supervisor
hands the lease over once the handle's secret proves it (``Adopt``, proof.py), and from then
it is this process's as if it had opened it: the block's end removes the container through the
supervisor, this process's death too (its connection's EOF). Nothing is planned or created
again; the session's time limit ends when it would have in the first process.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from sbxkit._consumers.handle import SandboxHandle
from sbxkit._consumers.session import Sandbox, serving
from sbxkit._lifecycle.owned import OwnedContainer
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._util.public import publish
from sbxkit.engine.client import open_engine

__all__ = ["attach_sandbox"]


@asynccontextmanager
async def attach_sandbox(handle: SandboxHandle) -> AsyncIterator[Sandbox]:
    """The detached sandbox of ``handle`` (``Sandbox.detach``), as a session of this process.

    Refused with ``ReattachRefused`` (nothing changes for the lease) for a wrong secret, a
    handle already used, a lease unknown or already ended. Leaving the block removes the
    container, as ``open_sandbox``'s does; it may be detached again.
    """
    plan = handle.plan
    async with open_engine(handle.engine_socket) as engine:
        owner = SupervisedOwner(
            engine,
            state_dir=Path(handle.state_dir),
            supervisor_command=handle.supervisor_command,
        )
        network = plan.network if plan.network is not None and plan.network.needs_governor else None
        container_id: str | None = None
        try:
            container_id = await owner.reattach(handle.lease, handle.secret, network=network)
            left = handle.deadline - time.time()  # the first process's time limit, as a span
            box = OwnedContainer.reattached(
                engine=engine,
                plan=plan,
                container_id=container_id,
                deadline=trio.current_time() + left,
                owner=owner,
            )
            async with serving(box, handle.files_root, handle.max_processes) as sandbox:
                yield sandbox
        finally:
            with trio.CancelScope(shield=True):
                await owner.remove(handle.lease, plan.name, container_id)


publish(__name__, globals())  # public names show as sbxkit.NAME
