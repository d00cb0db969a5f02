"""The supervisor under injected faults, against the real daemon (docs/operations.md).

A real supervisor process (``tests.supervision``) reaches the daemon only through a fault proxy
(``tests.faultproxy``) in front of ``/var/run/docker.sock``: ``--docker-socket PROXY``. The caller
(``run`` with a ``SupervisedOwner``) talks to the daemon directly for inspect/attach/start/wait;
create and remove go through the supervisor, hence through the proxy. The daemon is never stopped
or modified.

Everything that is claimed about containers is proven through the independent witness: leftovers
by listing, "never started" by the daemon's event log for the lease (a ``create`` and a
``destroy`` and no ``start``), "appeared late" by the time of the ``create`` event. Lease records
are read straight from the state directory's ``*.lease`` files.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError, CreateInterrupted, SbxError, SupervisorError
from tests.engine.helpers import actions, container_exists, spec
from tests.faultproxy import DelayReply, FaultProxy
from tests.supervision import (
    SupervisorProcess,
    running_supervisor,
)
from tests.witness import LEASE_LABEL, Witness

# The supervisor's own reaper interval in this module (tests.supervision's default).
REAPER_INTERVAL_S = 0.5
OUTSIDE_REMOVAL = (
    "the container is gone although the proxy let no removal through: something outside the "
    "supervisor removed it (another test session's no_leftovers on the same daemon?)"
)

# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_auto_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Supervisors here are started by the test only: an auto-launched, detached one (which would
    not go through the proxy and would outlive the test) must never appear."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")


@pytest.fixture
def proxy(witness: Witness) -> Iterator[FaultProxy]:
    with FaultProxy(witness.socket_path) as p:
        yield p
    assert not p.errors, f"the fault proxy itself failed: {p.errors}"


def supervisor(
    state_dir: Path, proxy: FaultProxy, *flags: str
) -> AbstractContextManager[SupervisorProcess]:
    """``running_supervisor`` reaching the daemon through the proxy; persistent, so it never
    idle-exits in the middle of a test."""
    return running_supervisor(state_dir, "--docker-socket", proxy.path, "--persistent", *flags)


# -- helpers ------------------------------------------------------------------------------------


def figure(name: str, value: float) -> None:
    """Measured figures, printed for the report (``pytest -s``)."""
    print(f"\nFIGURE {name}: {value:.3f} s")


def records(state_dir: Path) -> dict[str, dict[str, Any]]:
    """The journal as files: lease id → decoded ``*.lease`` JSON."""
    found: dict[str, dict[str, Any]] = {}
    if not state_dir.exists():
        return found
    for path in state_dir.glob("*.lease"):
        try:
            found[path.stem] = json.loads(path.read_text())
        except FileNotFoundError:
            continue
    return found


def lease_of_create(proxy: FaultProxy, index: int = 0) -> str:
    """The lease of the ``index``-th create the proxy received (from ``?name=sbxkit-<lease>``)."""
    target = proxy.exchanges("create")[index].target
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    name = query["name"][0]
    assert name.startswith("sbxkit-"), name
    return name.removeprefix("sbxkit-")


def lease_containers(witness: Witness, lease: str) -> list[dict[str, Any]]:
    return witness.containers(label=f"{LEASE_LABEL}={lease}")


def container_state(witness: Witness, lease: str) -> dict[str, Any] | None:
    response = witness.session.get(f"{witness.base}/containers/sbxkit-{lease}/json", timeout=30)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    state: dict[str, Any] = response.json()["State"]
    return state


def lease_events(witness: Witness, lease: str, since: float) -> list[dict[str, Any]]:
    return witness.events(since, time.time(), type=["container"], label=[f"{LEASE_LABEL}={lease}"])


def event_time(events: list[dict[str, Any]], action: str) -> float:
    """Unix time of the first ``action`` event."""
    for event in events:
        if event.get("Action") == action:
            return int(event["timeNano"]) / 1e9
    raise AssertionError(f"no {action!r} event in {actions(events)}")


def assert_created_destroyed_never_started(events: list[dict[str, Any]]) -> None:
    seen = actions(events)
    assert "create" in seen, seen
    assert "destroy" in seen, seen
    assert "start" not in seen, f"the payload started: {seen}"


async def eventually(predicate: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``predicate`` (in a worker thread: it may call the witness) until it holds; return
    the unix time it first held. Fails with ``what`` after ``seconds``."""
    deadline = trio.current_time() + seconds
    while True:
        if await trio.to_thread.run_sync(predicate):
            return time.time()
        if trio.current_time() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        await trio.sleep(0.02)


async def create_reached_proxy(proxy: FaultProxy, box: list[RunResult | BaseException]) -> None:
    """Wait for the first create at the proxy; a run that ended before it fails with its own
    outcome (e.g. a refused handshake) rather than a bare timeout."""
    await eventually(lambda: bool(box) or proxy.seen("create") >= 1, 10, "create at the proxy")
    assert proxy.seen("create") >= 1, f"the run ended before any create: {box[0]!r}"


async def logged(sup: SupervisorProcess, marker: str, seconds: float = 5.0) -> str:
    """The supervisor's log once it contains ``marker`` (it logs after acting, e.g. after the
    record is deleted, so a test that saw the effect may be ahead of the line)."""
    try:
        await eventually(lambda: marker in sup.log(), seconds, f"{marker!r} in the log")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{sup.log()}") from None
    return sup.log()


def write_record_file(path: Path, data: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(data).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


class TimedOwner(SupervisedOwner):
    """``SupervisedOwner`` that notes when the owner seam's calls end (trio clock)."""

    create_ended: float | None = None
    remove_ended: float | None = None

    async def create(self, request: CreateRequest) -> str:
        try:
            return await super().create(request)
        finally:
            self.create_ended = trio.current_time()

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        try:
            await super().remove(lease, name, container_id)
        finally:
            self.remove_ended = trio.current_time()


async def run_into(
    box: list[RunResult | BaseException], sandbox: SandboxSpec, engine: Engine, owner: Any
) -> None:
    """``run`` whose outcome (result or sbxkit error) lands in ``box``."""
    try:
        box.append(await run(sandbox, engine=engine, owner=owner))
    except SbxError as exc:
        box.append(exc)


async def kill_mid_run(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> tuple[str, str, CleanupError]:
    """Run ``sleep 30`` (3 s time limit); SIGKILL the supervisor while it runs. No supervisor
    can start again (``SBXKIT_SUPERVISOR`` is /bin/false here), so the caller cannot re-adopt
    its lease within its 1 s (issue 22, item 4): it fails as before re-adoption existed.
    Returns the lease, the container id and the caller's error, with the supervisor dead."""
    owner = SupervisedOwner(
        engine,
        state_dir=state_dir,
        startup_deadline_s=10.0,
        close_timeout_s=10.0,
        adopt_within_s=1.0,
    )
    box: list[RunResult | BaseException] = []
    with supervisor(state_dir, proxy) as sup:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                run_into, box, spec(busybox, "sleep 30", timeout_s=3.0), engine, owner
            )
            await create_reached_proxy(proxy, box)
            lease = lease_of_create(proxy)

            def running() -> bool:
                state = container_state(witness, lease)
                return state is not None and bool(state["Running"])

            await eventually(running, 10, "the payload runs")
            sup.kill()
            records_after_kill = records(state_dir)
        assert sup.proc.returncode == -9
    assert len(box) == 1
    error = box[0]
    assert isinstance(error, CleanupError), repr(error)
    assert "acknowledged" in str(error), str(error)
    assert "not re-adopted within 1 s" in str(error), str(error)
    assert error.lease == lease
    assert error.container_id is not None
    # The record stays on disk as ``created`` with the container's id, the container too.
    record = records_after_kill[lease]
    assert record["state"] == "created"
    assert record["container_id"] == error.container_id
    assert records(state_dir)[lease]["state"] == "created"
    assert container_exists(witness, error.container_id)
    return lease, error.container_id, error


# -- a. create delayed past the startup deadline --------------------------------------------------


async def test_create_delayed_past_startup_deadline_never_starts(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    proxy.delay_create(3.0)
    owner = TimedOwner(engine, state_dir=state_dir, startup_deadline_s=1.0, close_timeout_s=20.0)
    with supervisor(state_dir, proxy) as sup:
        since = time.time()
        t0 = trio.current_time()
        with pytest.raises(SupervisorError) as caught:
            await run(spec(busybox, "echo never"), engine=engine, owner=owner)
        t_end = trio.current_time()
        lease = caught.value.lease
        assert lease is not None
        assert "startup deadline" in caught.value.reason
        # The caller's create fails at the deadline, not when the daemon answers.
        assert owner.create_ended is not None
        figure("a: caller's create error after", owner.create_ended - t0)
        figure("a: caller's run() raised after", t_end - t0)
        assert 0.9 <= owner.create_ended - t0 < 2.0
        await eventually(lambda: not lease_containers(witness, lease), 10, "late container gone")
        await eventually(lambda: lease not in records(state_dir), 5, "record deleted")
        log = sup.log()
    events = lease_events(witness, lease, since)
    assert_created_destroyed_never_started(events)
    created_at, destroyed_at = event_time(events, "create"), event_time(events, "destroy")
    figure("a: container created after", created_at - since)
    figure("a: late container create -> destroy", destroyed_at - created_at)
    assert 2.8 <= created_at - since < 6.0  # the proxy held the create 3 s
    assert destroyed_at - created_at < 2.0
    assert (proxy.faulted("create"), proxy.passed("create")) == (1, 0)
    assert "uncertain" not in log, log  # the id came back: never a tombstone


# -- b. create reply lost, container materialises late -------------------------------------------


async def test_lost_create_leaves_uncertain_record_until_late_container_is_removed(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    """The proxy takes the create, closes the supervisor's connection without an answer (the
    supervisor's create fails: outcome uncertain), and only 2 s later forwards the create to
    the daemon, which then creates the container nobody knows the id of."""
    proxy.orphan_create(2.0)
    owner = SupervisedOwner(
        engine, state_dir=state_dir, startup_deadline_s=20.0, close_timeout_s=20.0
    )
    with supervisor(state_dir, proxy) as sup:
        since = time.time()
        with pytest.raises(CleanupError) as caught:
            await run(spec(busybox, "echo never"), engine=engine, owner=owner)
        lease = caught.value.lease
        assert caught.value.container_id is None
        assert "uncertain" in caught.value.reason, caught.value.reason
        # Uncertain record first, while the create has not reached the daemon.
        record = records(state_dir)[lease]
        observed_uncertain_at = time.time()
        assert record["state"] == "uncertain", record
        assert record["container_id"] is None
        assert proxy.exchanges("create")[0].forwarded_at is None
        assert not lease_containers(witness, lease)
        assert lease in records(state_dir)
        # Then the container materialises, and is removed without starting.
        await eventually(
            lambda: proxy.exchanges("create")[0].forwarded_at is not None, 10, "create forwarded"
        )
        await eventually(lambda: lease not in records(state_dir), 10, "record deleted")
        await eventually(lambda: not lease_containers(witness, lease), 5, "late container gone")
        await logged(sup, f"lease {lease}: late container")
    events = lease_events(witness, lease, since)
    assert_created_destroyed_never_started(events)
    created_at, destroyed_at = event_time(events, "create"), event_time(events, "destroy")
    assert observed_uncertain_at < created_at  # the record was uncertain before the container
    figure("b: late container create -> destroy (reaper 0.5 s)", destroyed_at - created_at)
    assert destroyed_at - created_at < 3.0
    assert proxy.faulted("create") == 1


async def test_late_container_is_removed_from_the_event_stream_without_polling(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    """As above, with a 30 s reaper interval: only the supervisor following the daemon's event
    stream (``_watch_events``) can remove the late container promptly. Regression: an uncertain
    record made by a live lease task used to start no event watcher (the lease was still in
    ``Service.live`` when the watcher and the reaper were woken), so the late container waited
    for the next reaper interval."""
    proxy.orphan_create(1.0)
    owner = SupervisedOwner(engine, state_dir=state_dir, startup_deadline_s=20.0)
    since = time.time()
    with supervisor(state_dir, proxy, "--reaper-interval", "30") as sup:
        try:
            with pytest.raises(CleanupError):
                await run(spec(busybox, "echo never"), engine=engine, owner=owner)
            lease = lease_of_create(proxy)
            assert records(state_dir)[lease]["state"] == "uncertain"
            await eventually(
                lambda: proxy.exchanges("create")[0].status is not None, 10, "late create landed"
            )
            await eventually(
                lambda: not lease_containers(witness, lease), 4, "late container removed"
            )
            await eventually(lambda: lease not in records(state_dir), 4, "record deleted")
            assert proxy.seen("events") >= 1  # followed /events through the proxy
        finally:
            # On failure the late container would wait 30 s for the reaper: remove it here.
            sup.stop()
            if proxy.exchanges("create"):
                await eventually(
                    lambda: proxy.exchanges("create")[0].status is not None, 10, "create landed"
                )
                for container in lease_containers(witness, lease_of_create(proxy)):
                    witness.remove(container["Id"])
    events = lease_events(witness, lease, since)
    assert_created_destroyed_never_started(events)
    created_at, destroyed_at = event_time(events, "create"), event_time(events, "destroy")
    figure("b2: late container create -> destroy (reaper 30 s)", destroyed_at - created_at)
    assert destroyed_at - created_at < 3.0


async def test_wakeup_during_a_recovery_pass_is_not_lost(
    witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    """A ``creating`` record on disk (a supervisor died mid-create); the restarted supervisor's
    first listing is answered 2 s late (the daemon takes the snapshot at once), and while that
    pass is in progress the late container appears. The event watcher sees its ``create`` and
    wakes the reaper; with a 30 s interval only that wake-up can remove it promptly.
    Regression: ``_reap`` used to replace ``wake_reaper`` with a fresh event *after* each pass,
    losing a wake-up set during the pass."""
    lease = secrets.token_hex(16)
    os.mkdir(state_dir, 0o700)
    now = time.time()
    write_record_file(
        state_dir / f"{lease}.lease",
        {
            "version": 1,
            "lease": lease,
            "name": f"sbxkit-{lease}",
            "state": "creating",
            "engine_socket": proxy.path,
            "registered_at": now,
            "lifetime_deadline": now + 600,
            "memory_bytes": 64 * 1024 * 1024,
            "nano_cpus": 500_000_000,
        },
    )
    proxy.add_fault("list", DelayReply(2.0), times=1)
    container_id: str | None = None
    with supervisor(state_dir, proxy, "--reaper-interval", "30") as sup:
        try:
            await eventually(lambda: proxy.seen("list") >= 1, 10, "the first listing")
            await eventually(lambda: proxy.seen("events") >= 1, 10, "the event watcher")
            await trio.sleep(0.3)
            response = await trio.to_thread.run_sync(
                lambda: witness.session.post(
                    f"{witness.base}/containers/create",
                    params={"name": f"sbxkit-{lease}"},
                    json={"Image": busybox, "Cmd": ["true"], "Labels": {LEASE_LABEL: lease}},
                    timeout=30,
                )
            )
            response.raise_for_status()
            container_id = response.json()["Id"]
            await eventually(
                lambda: not lease_containers(witness, lease), 5, "late container removed"
            )
            await eventually(lambda: lease not in records(state_dir), 5, "record deleted")
            await logged(sup, f"lease {lease}: late container")
        finally:
            sup.stop()
            if container_id is not None:
                witness.remove(container_id)
    events = lease_events(witness, lease, now)
    assert_created_destroyed_never_started(events)
    created_at, destroyed_at = event_time(events, "create"), event_time(events, "destroy")
    figure("wake-up: late container create -> destroy (reaper 30 s)", destroyed_at - created_at)
    assert destroyed_at - created_at < 3.0


# -- c. supervisor SIGKILLed during a run ---------------------------------------------------------


async def test_supervisor_killed_mid_run_is_recovered_on_restart(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    """The caller gave up (it could not re-adopt): the restarted supervisor holds the live
    container of the intact record for its grace period (here 2 s), then removes it as an
    orphan and says so (issue 22, item 2)."""
    since = time.time()
    lease, container_id, _error = await kill_mid_run(engine, witness, proxy, state_dir, busybox)
    restarted_at = time.time()
    with supervisor(state_dir, proxy, "--adopt-grace", "2") as sup:
        ready_at = time.time()
        await logged(sup, f"lease {lease}: container {container_id[:12]} is")
        assert container_exists(witness, container_id)  # held for its caller
        gone_at = await eventually(
            lambda: not container_exists(witness, container_id), 10, "container removed"
        )
        await eventually(lambda: lease not in records(state_dir), 5, "record deleted")
        log = await logged(sup, f"lease {lease}: recovered, container {container_id[:12]} removed")
        assert f"lease {lease}: expired unclaimed: no caller re-adopted it within the 2 s" in log
    events = lease_events(witness, lease, since)
    destroyed_at = event_time(events, "destroy")
    assert actions(events).count("destroy") == 1
    figure("c: supervisor restart (exec) -> listening", ready_at - restarted_at)
    figure("c: supervisor restart (exec) -> container destroyed", destroyed_at - restarted_at)
    figure("c: listening -> container gone (witness)", gone_at - ready_at)
    assert destroyed_at - ready_at > 2.0  # not before the grace period ended
    assert destroyed_at - restarted_at < 12.0


# -- d. supervisor SIGKILLed during a create ------------------------------------------------------


async def test_supervisor_killed_during_create_recovers_the_late_container(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    proxy.delay_create(3.0)
    # No supervisor can start (SBXKIT_SUPERVISOR is /bin/false): the caller gives up its
    # re-adoption after 1 s, before the late container appears. It never heard of a container,
    # so nothing of its payload ran: the run registers afresh under a new lease
    # (CreateInterrupted), which no supervisor can take either — that is its error.
    owner = SupervisedOwner(
        engine,
        state_dir=state_dir,
        startup_deadline_s=20.0,
        close_timeout_s=10.0,
        adopt_within_s=1.0,
    )
    box: list[RunResult | BaseException] = []
    since = time.time()
    with supervisor(state_dir, proxy) as sup:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_into, box, spec(busybox, "echo never"), engine, owner)
            await create_reached_proxy(proxy, box)
            await trio.sleep(1.0)
            sup.kill()
            killed_at = time.time()
            lease = lease_of_create(proxy)
            # Killed mid-create: intent on disk, no container yet (the proxy still holds it).
            assert records(state_dir)[lease]["state"] == "creating"
            assert proxy.exchanges("create")[0].forwarded_at is None
            assert not lease_containers(witness, lease)
    assert len(box) == 1
    error = box[0]
    assert isinstance(error, SupervisorError), repr(error)
    assert not isinstance(error, CleanupError | CreateInterrupted), repr(error)
    assert "did not open" in str(error), str(error)  # the fresh lease's launch: /bin/false
    assert list(records(state_dir)) == [lease]  # the fresh lease was never journaled
    proxy.clear_creates()  # the restart runs without the delay (the held create still lands)
    restarted_at = time.time()
    with supervisor(state_dir, proxy) as sup:
        await eventually(lambda: lease not in records(state_dir), 15, "record deleted")
        await eventually(lambda: not lease_containers(witness, lease), 5, "late container gone")
        await logged(sup, f"lease {lease}: late container")
    events = lease_events(witness, lease, since)
    assert_created_destroyed_never_started(events)
    created_at, destroyed_at = event_time(events, "create"), event_time(events, "destroy")
    assert created_at > killed_at  # the container materialised after the interruption
    figure("d: late container created after the kill", created_at - killed_at)
    figure("d: supervisor restart -> late container destroyed", destroyed_at - restarted_at)
    figure("d: late container create -> destroy", destroyed_at - created_at)
    assert destroyed_at - max(created_at, restarted_at) < 3.0  # once a supervisor is back


# -- e. removal failing, then healing ------------------------------------------------------------


async def test_failed_removal_keeps_the_record_and_the_reaper_finishes(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    proxy.fail_removals(500)
    owner = SupervisedOwner(
        engine, state_dir=state_dir, startup_deadline_s=10.0, close_timeout_s=20.0
    )
    with supervisor(state_dir, proxy) as sup:
        # A caller that waits for the removal hears of its failure; one that returned at the
        # payload's exit (the kernel path's default) leaves it to the supervisor alone.
        backend = DockerBackend(engine=engine, owner=owner, wait_for_removal=True)
        with pytest.raises(CleanupError) as caught:
            await run(spec(busybox, "true"), backend=backend)
        lease, container_id = caught.value.lease, caught.value.container_id
        assert container_id is not None
        assert "record kept" in caught.value.reason, caught.value.reason
        assert "injected failure" in caught.value.reason
        record = records(state_dir)[lease]
        assert record["state"] == "created"
        assert record["container_id"] == container_id
        assert proxy.passed("remove") == 0
        assert container_exists(witness, container_id), OUTSIDE_REMOVAL
        faulted_at_error = proxy.faulted("remove")
        assert faulted_at_error >= 1
        # The reaper keeps trying (and failing) while the fault is on.
        await eventually(
            lambda: proxy.faulted("remove") > faulted_at_error, 10, "the reaper retries"
        )
        assert proxy.passed("remove") == 0
        assert container_exists(witness, container_id), OUTSIDE_REMOVAL
        assert lease in records(state_dir)
        cleared_at = time.time()
        proxy.clear_removals()
        gone_at = await eventually(
            lambda: not container_exists(witness, container_id), 8, "reaper removed it"
        )
        await eventually(lambda: lease not in records(state_dir), 5, "record deleted")
        await logged(sup, f"lease {lease}: removal failed")
    figure("e: fault cleared -> container gone", gone_at - cleared_at)
    assert proxy.passed("remove") >= 1


# -- f. a record that names another lease ------------------------------------------------------


async def test_record_moved_to_another_lease_keeps_container_and_record(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    lease, container_id, _error = await kill_mid_run(engine, witness, proxy, state_dir, busybox)
    other = secrets.token_hex(16)
    old_path = state_dir / f"{lease}.lease"
    new_path = state_dir / f"{other}.lease"
    data = json.loads(old_path.read_text())
    data["lease"] = other
    write_record_file(new_path, data)
    old_path.unlink()
    assert new_path.stat().st_mode & 0o777 == 0o600
    try:
        with supervisor(state_dir, proxy) as sup:
            await eventually(
                lambda: "belongs to another lease" in sup.log(), 10, "the foreign label is logged"
            )
            await trio.sleep(4 * REAPER_INTERVAL_S)  # a few more reaper passes
            assert container_exists(witness, container_id)
            assert records(state_dir)[other]["container_id"] == container_id
            log = sup.log()
            assert f"lease {other}: container {container_id}" in log, log
            assert f"{LEASE_LABEL}={lease!r}" in log, log
            assert "never removed" in log
            assert proxy.passed("remove") == 0
            sup.stop()
    finally:
        await trio.to_thread.run_sync(witness.remove, container_id)
        new_path.unlink(missing_ok=True)
    assert not container_exists(witness, container_id)


# -- g. admission --------------------------------------------------------------------------------


async def test_max_workers_makes_the_next_lease_wait_its_turn(
    engine: Engine, witness: Witness, proxy: FaultProxy, state_dir: Path, busybox: str
) -> None:
    """A live-sandbox cap is admission: the second run waits (nothing reaches the daemon) and
    runs once the first sandbox is gone; it is never refused."""
    queued: list[int] = []
    owner = SupervisedOwner(
        engine, state_dir=state_dir, startup_deadline_s=10.0, close_timeout_s=20.0
    )
    waiting_owner = SupervisedOwner(
        engine,
        state_dir=state_dir,
        startup_deadline_s=10.0,
        close_timeout_s=20.0,
        on_queued=lambda ahead, waited: queued.append(ahead),
    )
    with supervisor(state_dir, proxy, "--max-workers", "1"):
        first = trio.CancelScope()
        box: list[RunResult | BaseException] = []
        second: list[RunResult] = []

        async def hold() -> None:
            with first:
                await run_into(box, spec(busybox, "sleep 30", timeout_s=20.0), engine, owner)

        async def then() -> None:
            second.append(
                await run(spec(busybox, "echo second"), engine=engine, owner=waiting_owner)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await create_reached_proxy(proxy, box)
            lease = lease_of_create(proxy)

            def running() -> bool:
                state = container_state(witness, lease)
                return state is not None and bool(state["Running"])

            await eventually(running, 10, "first sandbox runs")
            nursery.start_soon(then)
            await eventually(lambda: bool(queued), 10, "the second run is queued")
            assert proxy.seen("create") == 1  # the waiting run has not reached the daemon
            first.cancel()
        assert first.cancelled_caught
        assert box == []  # cancelled, and its cleanup raised nothing
        assert not lease_containers(witness, lease)
    (result,) = second
    assert (result.status, result.exit_code, result.stdout) == ("exited", 0, b"second\n")
    assert result.timings.queued_s > 0
    assert queued[0] == 0
    assert not lease_containers(witness, result.lease)
    assert proxy.seen("create") == 2
