"""The backend a CLI command runs on: Docker, or the sbx microVM runtime a profile selects.

``sbxkit run``, ``sbxkit shell`` and ``sbxkit batch`` all go through a backend
(``sbxkit.backends``); a consumer the chosen backend cannot serve (a shell on the sandbox
runtime) is refused by ``Backend.check`` before anything is created.
"""

from __future__ import annotations

from sbxkit._grammar.profile import PoolOptions, Profile, sandbox_options
from sbxkit._lifecycle.supervised import QueueObserver
from sbxkit._model.settings import Settings
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerBackend
from sbxkit.errors import SpecError
from sbxkit.pool.held import HeldPool, PooledBackend


def held_pool(pool: PoolOptions) -> HeldPool:
    """``--pool N`` (or a profile's ``[sandbox.docker.pool]``) as the supervisor's pool terms."""
    return HeldPool(size=pool.size, idle_ttl_s=pool.idle_ttl, max_timeout_s=pool.max_timeout)


def cli_backend(
    profile: Profile | None,
    *,
    socket_path: str | None,
    settings: Settings | None,
    on_queued: QueueObserver | None = None,
    pool: PoolOptions | None = None,
    wait_for_removal: bool = False,
) -> Backend:
    """The profile's ``[sandbox] runtime``: ``"sandbox"`` is the sbx runner (docs/adr-sbx.md),
    anything else the Docker backend on ``socket_path`` (``--socket``); with ``pool``, one
    whose one-shot runs claim from the supervisor's pool of their shape (docs/pool.md).

    The Docker backend asks the supervisor for no extra recovery pass: it recovers at its own
    start and in its reaper loop, and a CLI command should not pay for one more.
    ``wait_for_removal``: a run returns only once its container is confirmed gone
    (``DockerBackend``), not at the payload's exit.
    """
    options = sandbox_options(profile) if profile is not None else None
    if options is None and pool is not None:
        return PooledBackend(
            pool=held_pool(pool),
            socket_path=socket_path,
            settings=settings,
            on_queued=on_queued,
            recover_at_open=False,
        )
    if options is None:
        return DockerBackend(
            socket_path=socket_path,
            settings=settings,
            on_queued=on_queued,
            recover_at_open=False,
            wait_for_removal=wait_for_removal,
        )
    from sbxkit.backends.sbx import SbxBackend, SbxConfig  # loaded only when a profile selects it

    if socket_path is not None:
        raise SpecError("--socket", 'a Docker socket has no meaning under runtime = "sandbox"')
    if pool is not None:
        raise SpecError("--pool", "pre-started sandboxes are Docker's, not runtime = \"sandbox\"'s")
    config = SbxConfig(
        binary=options.binary,
        agent=options.agent,
        kits=list(options.kits),
        create_args=list(options.create_args),
    )
    return SbxBackend(config)
