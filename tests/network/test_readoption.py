"""A governed run outlives its supervisor's SIGKILL (issue 38, finding 6).

The allow-list proxy is the supervisor's socket in the sandbox's namespace: when the supervisor
is killed, nothing listens there and egress fails closed. Before, the lease was not re-adopted
and nothing ended the sandbox — a governed ``sleep`` ran on past its time limit until some
later supervisor started. Now the caller relaunches a supervisor at once (``sbxkit.run`` and
the command line's full path: the lease's link), which binds the listeners again when it
re-adopts the lease, and the caller's own time limit ends the run; a command line whose run
was handed to the killed supervisor has the next one remove the sandbox at its time limit
(``RunResume``), egress closed until then.

Each run probes an allowed upstream every 20 ms, printing each probe's outcome and time, so
the test sees egress before the kill, refused after it, and (re-adopted) back again. Each
supervisor here is launched as production launches one (umask 077), and SIGKILLed.

The bound: the sandbox must be gone (the daemon's ``destroy`` event) within ``BOUND_S`` of its
time limit, counted from its ``start`` event. What fills it: the caller's removal (the
daemon's kill and remove, under 1 s here) and, for a handed-off run, a supervisor launched at
the limit (a Python process importing trio and the CLI: 1-2 s on this shared 2-core machine)
re-adopting the lease. The old code's sandbox ran until its payload ended by itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

import sbxkit
from sbxkit._model.network_terms import Network
from sbxkit._model.settings import Settings
from sbxkit._protocol.statedir import LOG_NAME
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError
from tests.network.conftest import LAUNCHER_UMASK, supervisor_with_umask
from tests.network.payloads import SBXKIT_RUN
from tests.network.servers import ALLOWED, Servers
from tests.supervision import (
    auto_launched_supervisors,
    private_state_dir,
    signal_supervisors,
    supervisor_pids,
    wait_gone,
)
from tests.witness import LEASE_LABEL, PYTHON, Witness

LIMIT_S = 8
BOUND_S = 3.0
KILL_AFTER_S = 2.0
"""How long after the sandbox started its supervisor is killed (the probes have gone through)."""

PROBE = r"""
import time, urllib.request
while True:
    try:
        urllib.request.urlopen("http://allowed.sbxkit.test/tick", timeout=2).read()
        print("ok", time.time(), flush=True)
    except Exception as error:
        print("refused", time.time(), type(error).__name__, flush=True)
    time.sleep(0.02)
"""


def probe_spec() -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=["python3", "-c", PROBE],
        limits=sbxkit.Limits(
            cpus=1,
            memory_bytes=128 * sbxkit.MiB,
            pids=64,
            output_bytes=sbxkit.MiB,
            timeout_s=LIMIT_S,
        ),
        network=Network(allow=[f"{ALLOWED}:80"]),
    )


def probes(stdout: str) -> list[tuple[str, float]]:
    return [
        (fields[0], float(fields[1]))
        for fields in (line.split() for line in stdout.splitlines())
        if len(fields) >= 2 and fields[0] in ("ok", "refused")
    ]


def assert_egress(stdout: str, killed_at: float, *, back: bool) -> float:
    """Allowed until the kill; then refused — nothing listened once its supervisor died — until
    the governance was back (a re-adopted lease: ``back``), and never allowed in between. The
    time egress stayed closed (the first refusal to the next allowed probe, or to the end)."""
    seen = probes(stdout)
    assert seen, stdout
    assert all(verdict == "ok" for verdict, at in seen if at < killed_at), seen
    stretches = [seen[0][0]]
    for verdict, _ in seen[1:]:
        if verdict != stretches[-1]:
            stretches.append(verdict)
    assert stretches == (["ok", "refused", "ok"] if back else ["ok", "refused"]), stretches
    refused = [at for verdict, at in seen if verdict == "refused"]
    after = [at for verdict, at in seen if verdict == "ok" and at > refused[0]]
    return (after[0] if after else refused[-1]) - refused[0]


def sandbox_life(witness: Witness, lease: str, since: float) -> tuple[float, float]:
    """(start, destroy) of the lease's container, the daemon's event times (seconds)."""
    events = witness.events(
        since, time.time() + 1, type=["container"], label=[f"{LEASE_LABEL}={lease}"]
    )
    times = {event["Action"]: event["timeNano"] / 1e9 for event in events}
    assert "start" in times, events
    assert "destroy" in times, events
    return times["start"], times["destroy"]


async def running_sandbox(witness: Witness) -> str:
    """The lease of the one sbxkit container once it runs (the tier runs one at a time)."""
    with trio.fail_after(60):
        while True:
            running = [c for c in witness.sbxkit_containers() if c["State"] == "running"]
            if running:
                return str(running[0]["Labels"][LEASE_LABEL])
            await trio.sleep(0.05)


async def settled(witness: Witness) -> None:
    """Until the run's sandbox is gone: a result comes at its payload's exit and the removal
    follows, which the supervisors stopped at the end of a test must not cut short."""
    await trio.to_thread.run_sync(witness.wait_until_no_sbxkit_containers, 15.0)


def kill_supervisors(state_dir: Path) -> float:
    """SIGKILL every supervisor of ``state_dir`` (the one there is); the time it was sent."""
    sent = time.time()
    pids = signal_supervisors(state_dir)
    assert len(pids) == 1, pids
    wait_gone(pids)
    return sent


def supervisor_log(state_dir: Path) -> str:
    """What the auto-launched supervisors of ``state_dir`` logged."""
    return (state_dir / LOG_NAME).read_text(errors="replace")


async def test_a_governed_run_is_re_adopted_and_ends_by_its_limit(
    engine: Engine, witness: Witness, servers: Servers
) -> None:
    """``sbxkit.run``'s path: the lease's link relaunches the supervisor at once."""
    state_dir = private_state_dir()
    backend = DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(state_dir)),
        recover_at_open=False,
    )
    began = time.time()
    outcome: list[Any] = []
    killed: list[float] = []
    with auto_launched_supervisors(state_dir):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                try:
                    outcome.append(await backend.run_once(probe_spec()))
                except sbxkit.SbxError as exc:
                    outcome.append(exc)

            nursery.start_soon(run)
            lease = await running_sandbox(witness)
            await trio.sleep(KILL_AFTER_S)
            killed.append(await trio.to_thread.run_sync(kill_supervisors, state_dir))
        (result,) = outcome
        assert isinstance(result, sbxkit.RunResult), repr(result)
        assert result.status == "timed_out"  # the caller's limit, not a made-up status
        assert result.lease == lease
        assert result.denials == ()
        assert len(supervisor_pids(state_dir)) == 1  # the one the caller relaunched
        await settled(witness)
    log = supervisor_log(state_dir)
    assert f"lease {lease}: re-adopted by its caller" in log, log
    assert "its governed network's listeners bound again" in log, log
    assert_egress(result.stdout.decode(), killed[0], back=True)
    start, destroy = sandbox_life(witness, lease, began)
    assert destroy - start <= LIMIT_S + BOUND_S, destroy - start
    assert witness.sbxkit_containers() == []


def cli(state_dir: Path, trace: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *SBXKIT_RUN,
            *("--timeout", f"{LIMIT_S}s", "--allow", f"{ALLOWED}:80", "--memory", "128m"),
            *(PYTHON, "--", "python3", "-c", PROBE),
        ],
        env={
            **os.environ,
            "SBXKIT_STATE_DIR": str(state_dir),
            "SBXKIT_HANDOFF_TRACE": str(trace),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("path", ["full", "handed off"])
async def test_the_command_line_ends_a_governed_run_by_its_limit(
    path: str, witness: Witness, servers: Servers, tmp_path: Path
) -> None:
    """``sbxkit run``: with no supervisor running it launches one and holds the lease's link
    (the full path: re-adopted at once); with one running it hands the run to it, and once
    that one is killed the next one, launched at the run's limit, removes the sandbox."""
    state_dir = private_state_dir()
    trace = tmp_path / "handoff.trace"
    began = time.time()
    with auto_launched_supervisors(state_dir):
        if path == "handed off":
            with supervisor_with_umask(state_dir, LAUNCHER_UMASK) as first:
                proc = cli(state_dir, trace)
                lease = await running_sandbox(witness)
                await trio.sleep(KILL_AFTER_S)
                killed_at = time.time()
                first.kill()
        else:
            proc = cli(state_dir, trace)
            lease = await running_sandbox(witness)
            await trio.sleep(KILL_AFTER_S)
            killed_at = await trio.to_thread.run_sync(kill_supervisors, state_dir)
        stdout, stderr = await trio.to_thread.run_sync(proc.communicate)
        await settled(witness)
    how = trace.read_text().splitlines()
    if path == "handed off":
        assert sorted(how) == [
            "handed off",
            "resumed: the supervisor died; the one after it judged the run",
        ], how
    else:
        assert len(how) == 1, how
        assert how[0].startswith("full path: "), how
    document = json.loads(stdout)
    assert proc.returncode == 124, (proc.returncode, stderr)
    assert document["status"] == "timed_out", document
    assert document["lease"] == lease
    assert_egress(document["stdout"], killed_at, back=path == "full")
    log = supervisor_log(state_dir)
    if path == "full":
        assert "its governed network's listeners bound again" in log, log
    else:
        assert "its governed network stays closed" in log, log
    start, destroy = sandbox_life(witness, lease, began)
    assert destroy - start <= LIMIT_S + BOUND_S, destroy - start
    assert witness.sbxkit_containers() == []


SQUAT = r"""
import socket, time, urllib.request
while True:
    try:
        urllib.request.urlopen("http://allowed.sbxkit.test/tick", timeout=2).read()
        print("ok", time.time(), flush=True)
    except Exception:
        break  # its supervisor died: nothing listens on the proxy's port now
squatter = socket.socket()
squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the dead one's TIME_WAIT
squatter.bind(("127.0.0.1", 3128))
squatter.listen()
print("squatting", time.time(), flush=True)
time.sleep(300)
"""


async def test_a_sandbox_whose_listeners_cannot_be_put_back_is_removed_at_once(
    engine: Engine, witness: Witness, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile payload takes the proxy's port while no governor runs. Its lease is not
    re-adopted with a proxy of the payload's own: the new supervisor cannot bind, refuses the
    adoption and removes the sandbox at once (long before its limit), and the caller says so
    (``CleanupError`` naming why: its supervisor could not confirm the removal to it). The
    next supervisor is this test's, started once the payload holds the port (the caller can
    launch none: ``SBXKIT_SUPERVISOR`` fails), so the payload is first to it every time."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    state_dir = private_state_dir()
    backend = DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(state_dir)),
        recover_at_open=False,
    )
    spec = msgspec.structs.replace(
        probe_spec(),
        command=["python3", "-c", SQUAT],
        limits=msgspec.structs.replace(probe_spec().limits, timeout_s=60),
    )
    began = time.time()
    outcome: list[Any] = []
    said: list[str] = []
    probed, squatting, done = trio.Event(), trio.Event(), trio.Event()

    def on_output(stream: str, chunk: bytes) -> None:
        said.append(chunk.decode())
        if "ok" in "".join(said):
            probed.set()
        if "squatting" in "".join(said):
            squatting.set()

    async def run() -> None:
        try:
            outcome.append(await backend.run_once(spec, on_output=on_output))
        except sbxkit.SbxError as exc:
            outcome.append(exc)
        done.set()

    async with trio.open_nursery() as nursery:
        with supervisor_with_umask(state_dir, LAUNCHER_UMASK) as first:
            nursery.start_soon(run)
            with trio.fail_after(60):
                await probed.wait()
            lease = await running_sandbox(witness)
            killed_at = time.time()
            first.kill()
        with trio.move_on_after(30):
            await squatting.wait()
        # Seen once under load: no "squatting" in 30 s; what the payload said tells why.
        assert squatting.is_set(), f"the payload said: {''.join(said)[-2000:]!r}"
        with supervisor_with_umask(state_dir, LAUNCHER_UMASK) as second:
            with trio.fail_after(30):
                await done.wait()
            await settled(witness)
    log = second.log()
    (error,) = outcome
    assert isinstance(error, CleanupError), repr(error)
    assert "its governed network could not be put back" in str(error), str(error)
    assert f"lease {lease}: not re-adopted: its governed network could not be put back" in log
    _start, destroy = sandbox_life(witness, lease, began)
    assert destroy - killed_at <= BOUND_S + 2.0, destroy - killed_at  # not at its 60 s limit
    assert witness.sbxkit_containers() == []
