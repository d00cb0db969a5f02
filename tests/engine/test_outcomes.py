"""Every way a run can end, observed on the real engine.

Exit, output cap, timeout, OOM's cousins, caller cancellation and refused images: each outcome is
checked in the result AND, where the claim is about the daemon or the host (nothing left running,
nothing created), through the independent witness and the host's /proc.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._kernel.scripts import io_root
from sbxkit._model.spec import MiB
from sbxkit._plan.plan import effective_settings
from sbxkit.engine.client import Engine
from sbxkit.errors import ImageError, SbxError
from tests.engine.helpers import (
    actions,
    commit_with_volume,
    container_exists,
    container_file_lines,
    containers_with_marker,
    create_plain_container,
    created_here,
    delete_image,
    host_processes_of,
    image_volumes,
    processes_with_marker,
    python_spec,
    spec,
    tag_image,
    text,
    unique,
    wait_until,
    witness_exec,
)
from tests.engine.oneshot_paths import OneShot
from tests.engine.runtimes import is_gvisor
from tests.speed import bound
from tests.witness import LEASE_LABEL, Witness

N = 100_000
PATTERN = b"abcdefghi\n"


def _pattern(size: int) -> bytes:
    return (PATTERN * (size // len(PATTERN) + 1))[:size]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_exactly_n_bytes_pass_and_n_plus_one_is_output_exceeded(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, stream: str
) -> None:
    other = "stderr" if stream == "stdout" else "stdout"
    redirect = "" if stream == "stdout" else " >&2"

    exact = await oneshot(
        spec(busybox, f"yes abcdefghi | head -c {N}{redirect}", output_bytes=N, runtime=runtime),
        engine=engine,
    )
    assert exact.ok, exact
    assert exact.overflowed is None
    assert getattr(exact, stream) == _pattern(N)
    assert getattr(exact, other) == b""

    over = await oneshot(
        spec(
            busybox, f"yes abcdefghi | head -c {N + 1}{redirect}", output_bytes=N, runtime=runtime
        ),
        engine=engine,
    )
    assert over.status == "output_exceeded", over
    assert over.overflowed == stream
    assert getattr(over, stream) == _pattern(N)  # exactly N bytes kept: the head
    assert getattr(over, other) == b""


async def test_exit_code_is_reported(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    result = await oneshot(spec(busybox, "exit 17", runtime=runtime), engine=engine)

    assert result.status == "exited"
    assert result.exit_code == 17
    assert not result.ok


@contextlib.contextmanager
def low_descriptors_taken(below: int = 1100) -> Iterator[None]:
    """Every free descriptor number under ``below`` taken, so the next ones are higher."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    taken: list[int] = []
    try:
        while (fd := os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)) < below:
            taken.append(fd)
        os.close(fd)
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_process_holding_over_a_thousand_descriptors_runs_as_any_other(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    """A harness running hundreds of sandboxes from one process holds descriptors from 1024
    on, which ``select`` refuses (``FD_SETSIZE``): the run's FIFO ends, its init's pidfd and
    its connections get such numbers here, and the run is judged on the same evidence (the
    fixture checks which) — before 2026-12-05 the kernel path raised ``ValueError`` here."""
    with low_descriptors_taken():
        result = await oneshot(spec(busybox, "echo high; exit 5", runtime=runtime), engine=engine)

    assert (result.status, result.exit_code, result.stdout) == ("exited", 5, b"high\n"), result


async def test_one_mib_of_random_stdin_round_trips_through_cat(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    data = os.urandom(MiB)
    result = await oneshot(
        spec(busybox, "cat", output_bytes=2 * MiB, runtime=runtime), data, engine=engine
    )

    assert result.ok, (result.status, result.exit_code, result.stderr)
    assert len(result.stdout) == len(data)
    assert result.stdout == data


async def test_no_stdin_gives_the_payload_immediate_eof(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    start = trio.current_time()
    result = await oneshot(
        spec(busybox, "cat; echo eof", timeout_s=5.0, runtime=runtime), None, engine=engine
    )

    assert result.ok, result
    assert result.stdout == b"eof\n"
    # a run that waited for stdin is not ok (its 5 s timeout); this bounds the run's own cost
    assert trio.current_time() - start < bound(4.0, ceiling=30.0)


async def test_a_sleeping_payload_times_out_promptly(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, witness: Witness
) -> None:
    start = trio.current_time()
    result = await oneshot(
        spec(busybox, "sleep 30; echo woke", timeout_s=1.0, runtime=runtime), engine=engine
    )
    elapsed = trio.current_time() - start

    assert result.status == "timed_out", result
    assert result.exit_code is None
    assert b"woke" not in result.stdout
    assert not container_exists(witness, result.container_id)
    assert result.timings.run_s >= 0.9  # the limit was the one asked for, not an early exit
    assert elapsed < bound(10.0, ceiling=25.0)  # below the payload's 30 s


async def _watch_running_container(witness: Witness, marker: str, seen: list[str]) -> None:
    """Record the id of the running container whose command carries ``marker``."""
    while True:
        found = await trio.to_thread.run_sync(containers_with_marker, witness, marker)
        running = [c["Id"] for c in found if c.get("State") == "running"]
        if running:
            seen.extend(running)
            return
        await trio.sleep(0.05)


async def test_cancellation_mid_run_removes_the_container(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, witness: Witness
) -> None:
    marker = unique("cancel")
    seen: list[str] = []
    start = trio.current_time()
    cancelled_at = start
    with trio.move_on_after(60) as scope:  # only the cancel below ends it (the payload sleeps)
        async with trio.open_nursery() as nursery:

            async def cancel_once_running() -> None:
                nonlocal cancelled_at
                await _watch_running_container(witness, marker, seen)
                # A second in (a claim or a start under load is slower, never the cancel).
                await trio.sleep_until(max(start + 1.0, trio.current_time() + 0.3))
                cancelled_at = trio.current_time()
                scope.cancel()

            nursery.start_soon(cancel_once_running)
            await oneshot(
                spec(busybox, f"sleep 30; echo {marker}", timeout_s=20.0, runtime=runtime),
                engine=engine,
            )
    returned_after = trio.current_time() - cancelled_at

    assert scope.cancelled_caught
    assert cancelled_at > start, "never saw the container running"
    assert returned_after < 5.0
    assert len(seen) == 1, seen  # it really was running when the cancel hit
    # Immediately, not eventually: run() must not return before removal is confirmed.
    assert not container_exists(witness, seen[0])
    assert containers_with_marker(witness, marker) == []


TICKER = """
import os, sys, time
TICKS = "/tmp/ticks"
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    while True:  # the detached grandchild: its own session, reparented to init
        with open(TICKS, "a") as f:
            f.write("tick\\n")
        time.sleep(0.1)
os.waitpid(child, 0)
while True:
    try:
        with open(TICKS) as f:
            count = sum(1 for _ in f)
    except FileNotFoundError:
        count = 0
    print(count, flush=True)
    time.sleep(0.2)
"""


class _Sighting(msgspec.Struct):
    """What the host saw of the payload's processes while it ran."""

    detached_pids: set[int] = msgspec.field(default_factory=set)
    max_ticks: int = 0
    container_ids: set[str] = msgspec.field(default_factory=set)


def _look(marker: str, witness: Witness, sighting: _Sighting, gvisor: bool) -> None:
    if gvisor:  # the payload's processes live inside gVisor's Sentry, invisible to the host
        _look_through_exec(marker, witness, sighting)
        return
    procs = processes_with_marker(marker)
    # The cold path's init carries the command; a pooled run's init is the parked shell's
    # (its command came later): there the payload's main process, the oldest, is the anchor.
    inits = [p for p in procs if p.is_container_init]
    inits = inits or sorted(procs, key=lambda p: p.ns_pids[-1])[:1]
    if len(inits) == 1:
        for proc in procs:
            if proc is not inits[0] and proc.session != inits[0].session:
                sighting.detached_pids.add(proc.pid)
                ticks = container_file_lines(proc.pid, "/tmp/ticks")
                if ticks is not None:
                    sighting.max_ticks = max(sighting.max_ticks, ticks)
    sighting.container_ids.update(c["Id"] for c in containers_with_marker(witness, marker))


def _look_through_exec(marker: str, witness: Witness, sighting: _Sighting) -> None:
    """gVisor: the ticks file and the detached session, read by an exec of the witness's own."""
    found = containers_with_marker(witness, marker)
    sighting.container_ids.update(c["Id"] for c in found)
    for container in found:
        if container.get("State") != "running":
            continue
        seen = witness_exec(witness, container["Id"], ["python3", "-c", DETACHED_PROBE])
        words = (seen or b"").split()
        if len(words) == 2:
            if int(words[0]) > 0:
                sighting.detached_pids.add(int(words[0]))
            sighting.max_ticks = max(sighting.max_ticks, int(words[1]))


DETACHED_PROBE = """
import os
init_session = os.getsid(1)
detached = [p for p in os.listdir("/proc") if p.isdigit() and os.getsid(int(p)) not in
            (init_session, os.getsid(0))]
try:
    ticks = sum(1 for _ in open("/tmp/ticks"))
except OSError:
    ticks = 0
print(detached[0] if detached else 0, ticks)
"""
"""Inside the sandbox: a pid in a session of its own (not init's, not this exec's), and ticks."""


async def _observe(
    marker: str,
    witness: Witness,
    sighting: _Sighting,
    cancel_at_ticks: int | None = None,
    scope: trio.CancelScope | None = None,
    *,
    gvisor: bool = False,
) -> None:
    while True:
        await trio.to_thread.run_sync(_look, marker, witness, sighting, gvisor)
        if (
            scope is not None
            and cancel_at_ticks is not None
            and sighting.max_ticks >= cancel_at_ticks
        ):
            scope.cancel()
            return
        await trio.sleep(0.05)


def _assert_descendants_gone(marker: str, witness: Witness, container_id: str) -> None:
    """Within 2 s no process carries the marker or names the container (its shim, gVisor's
    sandbox and gofer, inside which gVisor's tasks live), and it stays so for 1.5 s more."""
    assert not container_exists(witness, container_id)
    assert wait_until(lambda: not processes_with_marker(marker), 2.0), processes_with_marker(marker)
    assert wait_until(lambda: not host_processes_of(container_id), 2.0)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert processes_with_marker(marker) == []
        assert containers_with_marker(witness, marker) == []
        time.sleep(0.1)


async def test_a_setsid_descendant_stops_ticking_after_timeout(
    oneshot: OneShot, runtime: str | None, engine: Engine, python_image: str, witness: Witness
) -> None:
    marker = unique("ticker-timeout")
    sighting = _Sighting()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(_observe, gvisor=is_gvisor(runtime)), marker, witness, sighting)
        result = await oneshot(
            python_spec(python_image, TICKER, marker, timeout_s=2.0, runtime=runtime), engine=engine
        )
        nursery.cancel_scope.cancel()

    assert result.status == "timed_out", result
    counts = [int(n) for n in text(result.stdout).split()]
    assert len(counts) >= 3, counts
    assert counts == sorted(counts), counts
    assert counts[-1] > counts[0], counts
    assert counts[-1] >= 5, counts
    assert sighting.detached_pids, "the host never saw the detached descendant"
    assert sighting.max_ticks >= 1
    assert witness.containers(label=f"{LEASE_LABEL}={result.lease}") == []
    _assert_descendants_gone(marker, witness, result.container_id)


async def test_a_setsid_descendant_stops_ticking_after_cancellation(
    oneshot: OneShot, runtime: str | None, engine: Engine, python_image: str, witness: Witness
) -> None:
    marker = unique("ticker-cancel")
    sighting = _Sighting()
    finished: list[object] = []
    with trio.move_on_after(15.0) as backstop:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(_observe, gvisor=is_gvisor(runtime)),
                marker,
                witness,
                sighting,
                5,
                nursery.cancel_scope,
            )
            finished.append(
                await oneshot(
                    python_spec(python_image, TICKER, marker, timeout_s=20.0, runtime=runtime),
                    engine=engine,
                )
            )
    cancelled_at = trio.current_time()

    assert not backstop.cancelled_caught, "the descendant never ticked 5 times"
    assert finished == []  # run() was cancelled, it did not return a result
    assert sighting.max_ticks >= 5
    assert sighting.detached_pids
    assert len(sighting.container_ids) == 1, sighting.container_ids
    (container_id,) = sighting.container_ids
    assert not container_exists(witness, container_id)  # immediately, not eventually
    _assert_descendants_gone(marker, witness, container_id)
    assert trio.current_time() - cancelled_at < bound(5.0, ceiling=15.0)  # its timeout: 20 s


def _container_events(events: list[dict[str, Any]], image: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if ((e.get("Actor") or {}).get("Attributes") or {}).get("image") == image
        or e.get("from") == image
    ]


async def test_an_image_with_a_volume_is_refused_and_nothing_runs(
    oneshot: OneShot, engine: Engine, busybox: str, witness: Witness
) -> None:
    setup_since = time.time()
    helper: str | None = None
    reference: str | None = None
    try:
        helper = create_plain_container(witness, busybox, unique("volume-helper"))
        reference = commit_with_volume(witness, helper, "sbxkit-test/volume", unique("vol"))
        witness.remove(helper)
        assert not container_exists(witness, helper)
        assert image_volumes(witness, reference) == {"/data": {}}
        setup_until = time.time()
        # Positive control: the events query (with an image filter) sees the helper's create.
        setup_events = witness.events(setup_since, setup_until, type=["container"], image=[busybox])
        assert "create" in actions([e for e in setup_events if e["Actor"]["ID"] == helper])

        since = time.time()
        with pytest.raises(ImageError) as caught:
            await oneshot(spec(reference, "echo ran"), engine=engine)
        until = time.time()

        assert "VOLUME" in str(caught.value)
        assert "/data" in str(caught.value)
        assert caught.value.image == reference
        filtered = witness.events(since, until, type=["container"], image=[reference])
        assert not {"create", "start"} & set(actions(filtered)), filtered
        everything = witness.events(since, until, type=["container"])
        assert _container_events(everything, reference) == []
    finally:
        if helper is not None:
            witness.remove(helper)
        if reference is not None:
            delete_image(witness, reference)
    assert not witness.image_exists(reference)


@pytest.mark.parametrize("named", ["runc", "crun"])
async def test_a_cold_runs_init_is_found_on_the_host_once_the_layout_is_known(
    engine: Engine, busybox: str, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    """The first kernel path run on a daemon learns its cgroup layout (per runtime) from
    State.Pid; later runs find their init in its cgroup's process list, and the post-create
    check is made on the supervisor's inspection (``Created.inspected``): the caller asks the
    daemon for no inspection at all, with the same kernel evidence."""
    first = await run(spec(busybox, "exit 3", runtime=named), engine=engine)
    assert (first.evidence, first.exit_code) == ("kernel", 3), first
    inspected: list[str] = []
    inspect = engine.container_inspect

    async def counted(container_id: str) -> Any:
        inspected.append(container_id)
        return await inspect(container_id)

    monkeypatch.setattr(engine, "container_inspect", counted)
    second = await run(spec(busybox, "echo found; exit 4", runtime=named), engine=engine)
    assert (second.evidence, second.exit_code, second.stdout) == ("kernel", 4, b"found\n")
    assert inspected == [], (inspected, first, second)


async def test_a_name_moved_to_another_image_is_planned_again(
    engine: Engine, busybox: str, python_image: str, witness: Witness
) -> None:
    """A one-shot run plans on an inspection of its image up to IMAGE_FACTS_MAX_AGE_S old; a
    name moved meanwhile is caught on the created container (ImageChanged), which is removed
    unstarted, and the run is planned again on a fresh inspection — a VOLUME is still refused."""
    moving = f"sbxkit-test/moving:{unique('moved')}"
    helper: str | None = None
    with_volume: str | None = None
    try:
        tag_image(witness, busybox, *moving.split(":"))
        first = await run(spec(moving, "echo busybox"), engine=engine)  # inspected: busybox
        assert (first.status, first.stdout) == ("exited", b"busybox\n"), first
        tag_image(witness, python_image, *moving.split(":"))
        since = time.time()
        second = await run(python_spec(moving, "print(6 * 7)"), engine=engine)
        assert (second.status, second.stdout) == ("exited", b"42\n"), second
        events = witness.events(since, time.time(), type=["container"])
        assert actions(events).count("create") == 2  # the stale plan's, removed unstarted
        assert created_here(events).count("start") == 1
        helper = create_plain_container(witness, busybox, unique("moving-helper"))
        with_volume = commit_with_volume(witness, helper, "sbxkit-test/volume", unique("mv"))
        tag_image(witness, with_volume, *moving.split(":"))
        since = time.time()
        with pytest.raises(ImageError, match="VOLUME"):
            await run(spec(moving, "echo ran"), engine=engine)
        assert "start" not in created_here(witness.events(since, time.time(), type=["container"]))
        # Removed within the 10 s: the run planned on the old inspection fails at the create
        # (nothing starts); the next one inspects afresh and is refused as missing.
        tag_image(witness, busybox, *moving.split(":"))
        again = await run(spec(moving, "echo again"), engine=engine)
        assert again.stdout == b"again\n", again
        delete_image(witness, moving)
        since = time.time()
        with pytest.raises(SbxError):
            await run(spec(moving, "echo gone"), engine=engine)
        with pytest.raises(ImageError, match="not present locally"):
            await run(spec(moving, "echo gone"), engine=engine)
        assert "start" not in created_here(witness.events(since, time.time(), type=["container"]))
    finally:
        if helper is not None:
            witness.remove(helper)
        delete_image(witness, moving)
        if with_volume is not None:
            delete_image(witness, with_volume)


async def test_a_missing_image_is_refused_and_never_pulled(
    oneshot: OneShot, engine: Engine, witness: Witness
) -> None:
    reference = f"sbxkit-test/missing:{unique('absent')}"
    marker = unique("missing")
    since = time.time()
    with pytest.raises(ImageError) as caught:
        await oneshot(spec(reference, f"echo {marker}"), engine=engine)
    until = time.time()

    message = str(caught.value)
    assert "not present locally" in message
    assert "never pulls" in message
    assert not witness.image_exists(reference)
    assert containers_with_marker(witness, marker) == []
    container_events = witness.events(since, until, type=["container"], image=[reference])
    assert "create" not in actions(container_events)
    assert _container_events(witness.events(since, until, type=["container"]), reference) == []
    image_events = witness.events(since, until, type=["image"])
    assert [e for e in image_events if reference in str(e)] == []


async def test_an_early_exit_while_stdin_is_still_being_sent_does_not_hang(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    with trio.fail_after(15.0):
        result = await oneshot(
            spec(busybox, "exit 5", timeout_s=10.0), os.urandom(4 * MiB), engine=engine
        )

    assert result.status == "exited", result
    assert result.exit_code == 5


async def test_interleaved_stdout_and_stderr_stay_separate_and_complete(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    lines = 3000
    script = f'i=0; while [ $i -lt {lines} ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done'
    result = await oneshot(spec(busybox, script), engine=engine)

    assert result.ok, result.status
    assert result.overflowed is None
    assert result.stdout == b"".join(b"out %d\n" % i for i in range(lines))
    assert result.stderr == b"".join(b"err %d\n" % i for i in range(lines))


async def test_a_returned_runs_fifo_directory_goes_with_its_container(
    engine: Engine, busybox: str, witness: Witness
) -> None:
    """A kernel path run returns at its payload's exit, handing the removal to the supervisor,
    which removes the lease's FIFO directory once the daemon confirmed the container gone:
    nothing of the run is left beside the state directory."""
    result = await run(spec(busybox, "exit 0"), engine=engine)
    assert (result.evidence, result.exit_code) == ("kernel", 0), result
    state_dir = effective_settings(None).supervisor_state_dir
    assert state_dir is not None
    fifos = io_root(Path(state_dir)) / result.lease
    leased = f"{LEASE_LABEL}={result.lease}"

    def gone() -> bool:
        return not fifos.exists() and witness.containers(leased) == []

    assert await trio.to_thread.run_sync(wait_until, gone, 10.0), (fifos.exists(), leased)
