"""The paths of a one-shot run, for tests that must hold on each (issues 13 and 21): ``cold`` is
``sbxkit._consumers.runner.run``; ``pooled`` parks a container of the spec's shape in a pool of one
in this process, claims it and closes the pool; ``held`` has the supervisor park one
(``PooledBackend.warm``), claims it and ends the supervisor's pool of that shape (so the run, and
the pool, are gone when it returns).

Each runs on both evidence paths: as the host allows (the kernel's: FIFOs and a pidfd, on this
CI machine) and forced onto the daemon's (``-daemon``, ``SBXKIT_EVIDENCE=daemon``). On the
kernel's, an exit by itself of a test image must have been decided by the kernel — a silent
fall-back to the daemon's path fails the test. gVisor has no kernel path (its init is its own
kernel's); ``SBXKIT_TEST_EVIDENCE=daemon`` (the Podman cell) keeps the daemon's only,
``SBXKIT_TEST_EVIDENCE=kernel`` (the Docker 26.1 cell) the product's default only. On a kernel
without ``PIDFD_GET_INFO`` (Linux < 6.15) the host allows only the daemon's: every result must
say so."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec
import pytest
import trio

from sbxkit._consumers.runner import run as cold_run
from sbxkit._kernel.scripts import shell_carries
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.docker import DockerBackend
from sbxkit.errors import PoolUnavailable
from sbxkit.pool import open_pool
from sbxkit.pool.held import WARM_WAIT_S, HeldPool, PooledBackend
from tests.engine.runtimes import is_gvisor
from tests.speed import bound
from tests.witness import BUSYBOX, PYTHON

OneShot = Callable[..., Awaitable[RunResult]]
COMMAND_LABEL = "sbxkit.test.command"
WARM_CEILING_S = 300.0
"""``PooledBackend.warm``'s own wait is stretched by the machine's slowness (tests/speed.py)
up to this: a park that takes longer is broken on any machine the suite runs on."""


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
    assert result.pooled == (parked and not served_cold), (
        f"pooled {result.pooled} after parking {'one' if parked else 'none'} "
        f"(served_cold {served_cold})"
    )
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
    parked, started, warmed = True, True, "parked"
    try:
        # A cancel can land in the warm-up (a slow machine parks the container, which the
        # test sees running, before the poll that says so): the pool is ended all the same.
        try:
            # Scaled: in the emulated VM a park can outlast the product's 30 s, and a warm-up
            # that gave up is no "cannot park" (the claim then takes the park under way).
            await backend.warm(spec, wait_s=bound(WARM_WAIT_S, ceiling=WARM_CEILING_S))
        except PoolUnavailable as exc:
            parked, warmed = False, str(exc)  # e.g. an image without /bin/sh: the run goes cold
        except Exception as exc:
            parked = started = False  # e.g. a missing image: the claim runs cold and meets it
            warmed = repr(exc)
        result = await backend.run_once(spec, stdin, on_output=on_output)
    finally:
        if started:
            with trio.CancelScope(shield=True):
                await backend.end(spec)
    assert result.pooled == (parked and not served_cold), (
        f"pooled {result.pooled} after the warm-up's {warmed!r} (served_cold {served_cold})"
    )
    return result


def _labelled(spec: SandboxSpec) -> SandboxSpec:
    # The command reaches a pooled container only at the claim: a label carries it from the
    # start, so a test that looks for its container by a marker in the command finds it
    # (``helpers.containers_with_marker``; gVisor's ``top`` shows no command lines).
    text = "".join(" " if not char.isprintable() else char for char in " ".join(spec.command))
    return msgspec.structs.replace(spec, labels={**spec.labels, COMMAND_LABEL: text[:4000]})


def _kernel_exit_info(release: str) -> bool:
    """Linux >= 6.15 answers ``PIDFD_GET_INFO`` with exit information: read from the release
    here, not from the product's own probe (sbxkit/_plan/kernel_host.py) that this checks."""
    found = re.match(r"(\d+)\.(\d+)", release)
    assert found, release
    return (int(found[1]), int(found[2])) >= (6, 15)


KERNEL_EXIT_INFO = _kernel_exit_info(os.uname().release)
"""False on Debian 12's 6.1 (the cgroup v2 cell's second boot): every run of the "auto" paths
must then take the daemon's path by itself."""


def _on_evidence(run: OneShot, evidence: str) -> OneShot:
    async def evidenced(
        spec: SandboxSpec, stdin: StdinSource | None = None, **options: Any
    ) -> RunResult:
        if evidence == "daemon":
            with _environment("SBXKIT_EVIDENCE", "daemon"):
                result = await run(spec, stdin, **options)
            assert result.evidence == "daemon", result
            return result
        result = await run(spec, stdin, **options)
        if not KERNEL_EXIT_INFO:
            assert result.evidence == "daemon", (
                f"Linux {os.uname().release} has no PIDFD_GET_INFO: the daemon's path",
                result,
            )
            return result
        code = result.exit_code
        carried = all(shell_carries(key) for key in spec.env)  # else no shell can carry it
        kernels = spec.image in (BUSYBOX, PYTHON) and not is_gvisor(spec.runtime) and carried
        if kernels and code is not None and code <= 128:
            assert result.evidence == "kernel", "the kernel path fell back to the daemon's"
        return result

    return evidenced


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


_RUNS = {"cold": cold_run, "pooled": pooled_run, "held": held_run}
PATHS: dict[str, OneShot] = {
    **{name: _on_evidence(run, "auto") for name, run in _RUNS.items()},
    **{f"{name}-daemon": _on_evidence(run, "daemon") for name, run in _RUNS.items()},
}


def oneshot_paths(runtime: str | None) -> list[str]:
    """The one-shot paths a test runs on under ``runtime`` (see the module docstring);
    ``SBXKIT_TEST_EVIDENCE=daemon`` or ``kernel`` keeps one evidence path (a cell of another
    engine)."""
    only = os.environ.get("SBXKIT_TEST_EVIDENCE", "")
    if is_gvisor(runtime) or only == "daemon":
        return [name for name in PATHS if name.endswith("-daemon")]
    if only == "kernel":
        return [name for name in PATHS if not name.endswith("-daemon")]
    return list(PATHS)


@pytest.fixture
def oneshot(request: pytest.FixtureRequest) -> OneShot:
    """The one-shot path of this test's parameter (``pytest_generate_tests``, conftest.py)."""
    return PATHS[request.param]
