"""The two paths of a one-shot run, for tests that must hold on both (issue 13): ``cold`` is
``sbxkit.runner.run``; ``pooled`` parks a container of the spec's shape in a pool of one,
claims it and closes the pool (so the run, and the pool, are gone when it returns)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from sbxkit.backends.docker import DockerBackend
from sbxkit.pool import open_pool
from sbxkit.result import RunResult
from sbxkit.runner import run as cold_run
from sbxkit.spec import SandboxSpec
from sbxkit.stdin import StdinSource

OneShot = Callable[..., Awaitable[RunResult]]
COMMAND_LABEL = "sbxkit.test.command"


async def pooled_run(
    spec: SandboxSpec, stdin: StdinSource | None = None, **options: Any
) -> RunResult:
    """``run(spec, stdin, engine=..., on_output=...)`` through a pool of one, claimed once."""
    on_output = options.pop("on_output", None)
    backend = DockerBackend(**options)
    # The command reaches a pooled container only at the claim: a label carries it from the
    # start, so a test that looks for its container by a marker in the command finds it
    # (``helpers.containers_with_marker``; gVisor's ``top`` shows no command lines).
    text = "".join(" " if not char.isprintable() else char for char in " ".join(spec.command))
    spec = msgspec.structs.replace(spec, labels={**spec.labels, COMMAND_LABEL: text[:4000]})
    async with open_pool(spec, size=1, backend=backend, refill=False) as pool:
        parked = True
        try:
            await pool.wait_ready(1)
        except Exception:
            parked = False  # e.g. a missing image: the claim runs cold and meets the error
        result = await pool.run(spec, stdin, on_output=on_output, wait_for_removal=True)
    assert result.pooled == parked, "a parked container of the spec's own shape was not claimed"
    return result


@pytest.fixture(params=["cold", "pooled"])
def oneshot(request: pytest.FixtureRequest) -> OneShot:
    """A one-shot run on the cold path, then on the pooled one."""
    return cold_run if request.param == "cold" else pooled_run
