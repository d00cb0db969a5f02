"""The paths of a one-shot run, for tests that must hold on each (issue 13): ``cold`` is
``sbxkit.runner.run``; ``pooled`` parks a container of the spec's shape in a pool of one in
this process, claims it and closes the pool; ``held`` has the supervisor park one
(``PooledBackend.warm``), claims it and ends the supervisor's pool of that shape (so the run,
and the pool, are gone when it returns)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
import trio

from sbxkit.backends.docker import DockerBackend
from sbxkit.pool import open_pool
from sbxkit.pool.held import HeldPool, PooledBackend, PoolUnavailable
from sbxkit.result import RunResult
from sbxkit.runner import run as cold_run
from sbxkit.spec import SandboxSpec
from sbxkit.stdin import StdinSource

OneShot = Callable[..., Awaitable[RunResult]]
COMMAND_LABEL = "sbxkit.test.command"


async def pooled_run(
    spec: SandboxSpec,
    stdin: StdinSource | None = None,
    *,
    served_cold: bool = False,
    **options: Any,
) -> RunResult:
    """``run(spec, stdin, engine=..., on_output=...)`` through a pool of one, claimed once
    (``served_cold``: the pool must serve it cold, e.g. a claim line cannot carry it)."""
    on_output = options.pop("on_output", None)
    backend = DockerBackend(**options)
    spec = _labelled(spec)
    async with open_pool(spec, size=1, backend=backend, refill=False) as pool:
        parked = True
        try:
            await pool.wait_ready(1)
        except Exception:
            parked = False  # e.g. a missing image: the claim runs cold and meets the error
        result = await pool.run(spec, stdin, on_output=on_output, wait_for_removal=True)
    assert result.pooled == (parked and not served_cold), "pooled where it must not be, or not"
    return result


async def held_run(
    spec: SandboxSpec,
    stdin: StdinSource | None = None,
    *,
    served_cold: bool = False,
    **options: Any,
) -> RunResult:
    """``run(spec, stdin, engine=..., on_output=...)`` claimed from the supervisor's pool of
    the spec's shape (one parked first), which is ended afterwards (``served_cold``: as for
    ``pooled_run``)."""
    on_output = options.pop("on_output", None)
    backend = PooledBackend(pool=HeldPool(size=1, wait_for_removal=True, refill=False), **options)
    spec = _labelled(spec)
    parked, started = True, True
    try:
        await backend.warm(spec)
    except PoolUnavailable:
        parked = False  # e.g. an image without /bin/sh: the run goes cold
    except Exception:
        parked = started = False  # e.g. a missing image: the claim runs cold and meets it
    try:
        result = await backend.run_once(spec, stdin, on_output=on_output)
    finally:
        if started:
            with trio.CancelScope(shield=True):
                await backend.end(spec)
    assert result.pooled == (parked and not served_cold), "pooled where it must not be, or not"
    return result


def _labelled(spec: SandboxSpec) -> SandboxSpec:
    # The command reaches a pooled container only at the claim: a label carries it from the
    # start, so a test that looks for its container by a marker in the command finds it
    # (``helpers.containers_with_marker``; gVisor's ``top`` shows no command lines).
    text = "".join(" " if not char.isprintable() else char for char in " ".join(spec.command))
    return msgspec.structs.replace(spec, labels={**spec.labels, COMMAND_LABEL: text[:4000]})


PATHS = {"cold": cold_run, "pooled": pooled_run, "held": held_run}


@pytest.fixture(params=list(PATHS))
def oneshot(request: pytest.FixtureRequest) -> OneShot:
    """A one-shot run on the cold path, then pooled in this process, then held by the
    supervisor."""
    return PATHS[request.param]
