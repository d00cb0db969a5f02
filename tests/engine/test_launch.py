"""A kernel path run's container is started by its supervisor, the moment it is verified
(``Register.launch``, issue 21): one round trip before its caller could, while its payload
still waits for the caller's go line.

Each test puts a fault proxy between the supervisor (``--docker-socket``) and the daemon while
the caller talks to the daemon directly, so what the proxy saw is the supervisor's alone:
that it inspected the container before it started it, and started it once; a start the
daemon refuses is the run's error, with nothing left; a supervisor that dies before the daemon
answered its start leaves the start to the caller, which re-adopts the lease and runs on; one
that dies after its start landed but before its created record was durable leaves a running
container that the restarted supervisor still hands over. The independent witness counts the
daemon's events.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import RunResult
from sbxkit.engine.client import Engine
from sbxkit.errors import EngineError
from tests.engine.helpers import actions, spec
from tests.engine.test_readoption import eventually, readopted, records, removed_exactly_once
from tests.faultproxy import Delay, Fail, FaultProxy
from tests.supervision import running_supervisor
from tests.witness import LEASE_LABEL, Witness


@pytest.fixture(autouse=True)
def _no_auto_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the test's own supervisors, behind the proxy, ever serve these runs."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")


class NotingOwner(SupervisedOwner):
    """``SupervisedOwner`` that says when its create returned, and whether its supervisor
    was launching the container then."""

    def __init__(self, engine: Engine, state_dir: Path) -> None:
        super().__init__(engine, state_dir=state_dir)
        self.created = trio.Event()
        self.lease = ""
        self.launched_then: bool | None = None

    async def create(self, request: CreateRequest) -> str:
        self.lease = request.lease
        container_id = await super().create(request)
        self.launched_then = self.launching(request.lease)
        self.created.set()
        return container_id


def lease_actions(witness: Witness, lease: str, since: float) -> list[str]:
    events = witness.events(
        since, time.time(), type=["container"], label=[f"{LEASE_LABEL}={lease}"]
    )
    return actions(events)


async def test_the_supervisor_starts_the_container_it_verified_and_the_run_is_the_payloads(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    owner = NotingOwner(engine, state_dir)
    since = time.time()
    with FaultProxy(witness.socket_path) as proxy:
        flags = ("--docker-socket", proxy.path, "--persistent")
        with running_supervisor(state_dir, *flags):
            result = await run(
                spec(busybox, "echo made; echo said >&2; exit 5"), engine=engine, owner=owner
            )
            await removed_exactly_once(witness, state_dir, result.lease, since)
        (inspect, *_) = proxy.exchanges("inspect")
        (start,) = proxy.exchanges("start")
    assert (result.status, result.exit_code, result.evidence) == ("exited", 5, "kernel")
    assert (result.stdout, result.stderr) == (b"made\n", b"said\n")
    assert owner.launched_then is True
    # The supervisor's own requests: it inspected the container, then started it (once); the
    # caller, on the daemon's socket, started nothing (the daemon saw one start in all).
    assert inspect.received_at < start.received_at
    assert start.status == 204
    assert lease_actions(witness, result.lease, since).count("start") == 1


async def test_a_start_the_daemon_refuses_is_the_runs_error_and_nothing_is_left(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    owner = NotingOwner(engine, state_dir)
    since = time.time()
    with FaultProxy(witness.socket_path) as proxy:
        proxy.add_fault("start", Fail(500, "injected: the runtime refused"), times=1)
        with running_supervisor(state_dir, "--docker-socket", proxy.path, "--persistent"):
            with pytest.raises(EngineError) as caught:
                await run(spec(busybox, "echo never"), engine=engine, owner=owner)
            await eventually(lambda: not records(state_dir), 20, "the lease's record deleted")
    assert owner.launched_then is True
    assert caught.value.status == 500
    assert "injected: the runtime refused" in caught.value.message
    assert caught.value.path.endswith("/start")
    assert proxy.faulted("start") == 1
    assert not witness.sbxkit_containers()
    assert lease_actions(witness, owner.lease, since) == ["create", "destroy"]  # never started


async def test_a_supervisor_that_dies_before_its_start_is_answered_leaves_the_start_to_the_caller(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """The proxy holds the supervisor's start; the supervisor is killed once its caller heard
    ``Created``. The caller re-adopts the lease in the restarted supervisor, which never
    started the container, so it starts it itself (a start that finds it running is fine) and
    the run goes on: the payload's own result, one container, removed once."""
    owner = NotingOwner(engine, state_dir)
    since = time.time()
    results: list[RunResult] = []

    async def one_run() -> None:
        results.append(await run(spec(busybox, "echo made; exit 9"), engine=engine, owner=owner))

    with FaultProxy(witness.socket_path) as proxy:
        proxy.add_fault("start", Delay(5.0), times=1)
        flags = ("--docker-socket", proxy.path, "--persistent", "--adopt-grace", "10")
        with running_supervisor(state_dir, *flags) as first, contextlib.ExitStack() as later:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one_run)
                with trio.fail_after(20):
                    await owner.created.wait()
                await eventually(lambda: proxy.seen("start") == 1, 15, "the start is held")
                (lease,) = records(state_dir)
                first.kill()
                second = later.enter_context(running_supervisor(state_dir, *flags))
                await readopted(state_dir, lease, second.log)
            events = await removed_exactly_once(witness, state_dir, lease, since)
    (result,) = results
    assert owner.launched_then is True
    assert (result.status, result.exit_code, result.stdout) == ("exited", 9, b"made\n")
    assert result.evidence == "kernel"
    assert events.count("start") == 1, events


async def test_a_container_launched_before_its_created_record_was_durable_is_re_adopted(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """The supervisor's start goes out beside the created record's fsync: one that dies in
    between leaves a ``creating`` record whose container runs, its shell waiting for the go
    line, and a caller that never heard ``Created``. Made here by holding the create (the
    supervisor is killed with its record ``creating``) and starting the late container, as
    that start would have, while the proxy holds the restarted supervisor's inspection of it.
    The restarted supervisor hands the running container over, the caller checks it and lets
    the payload go: its own result, one start, removed once."""
    owner = NotingOwner(engine, state_dir)
    since = time.time()
    results: list[RunResult] = []

    async def one_run() -> None:
        results.append(await run(spec(busybox, "echo made; exit 9"), engine=engine, owner=owner))

    with FaultProxy(witness.socket_path) as proxy:
        proxy.delay_create(3.0)
        flags = ("--docker-socket", proxy.path, "--persistent", "--adopt-grace", "10")
        with running_supervisor(state_dir, *flags) as first, contextlib.ExitStack() as later:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one_run)
                await eventually(lambda: proxy.seen("create") == 1, 15, "the create is held")
                (lease,) = records(state_dir)
                first.kill()
                proxy.add_fault("inspect", Delay(2.0), times=1)
                second = later.enter_context(running_supervisor(state_dir, *flags))
                await eventually(lambda: proxy.seen("inspect") == 1, 15, "its inspection held")
                (container,) = witness.containers(f"{LEASE_LABEL}={lease}")
                await engine.container_start(container["Id"])  # the dead supervisor's launch
                await readopted(state_dir, lease, second.log)
            events = await removed_exactly_once(witness, state_dir, lease, since)
    (result,) = results
    assert owner.launched_then is False  # the caller heard Adopted, not Created
    assert (result.status, result.exit_code, result.stdout) == ("exited", 9, b"made\n")
    assert result.evidence == "kernel"
    assert events.count("start") == 1, events
