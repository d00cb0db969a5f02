"""The lease supervisor against the real engine: a real supervisor process, real containers.

Every claim about the daemon goes through the independent witness, every claim about processes
through the host's /proc, and every claim about the journal through the state directory's
files. Each test ends with zero sbxkit containers (the autouse ``no_leftovers`` fixture, plus
explicit witness checks here).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._plan.plan import new_lease_id
from sbxkit._plan.policy import LEASE_LABEL, build_create_body, container_name
from sbxkit._protocol.fingerprint import implementation_fingerprint
from sbxkit._protocol.journal import SOCKET_NAME, StateDir, check_state_dir
from sbxkit._protocol.records import LeaseRecord, encode_record, record_filename
from sbxkit._protocol.wire import (
    PROTOCOL_VERSION,
    Close,
    Closed,
    Created,
    FrameReader,
    Hello,
    Message,
    Refused,
    Register,
    Registered,
    Reservation,
    ServerMessage,
    Welcome,
    decode_server,
    encode,
)
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError, StorageError, SupervisorError
from sbxkit.supervisor.lifecycle import REGISTERED_HELD_S
from tests.engine.helpers import (
    container_exists,
    container_file_lines,
    container_gone_at,
    containers_with_marker,
    processes_with_marker,
    removal_after_sigkill,
    spec,
    unique,
    wait_until,
)
from tests.faultproxy import FaultProxy
from tests.supervision import (
    running_supervisor,
    supervisor_command,
)
from tests.witness import SOCKET, Witness

# --- helpers ------------------------------------------------------------------------------------


def lease_files(state_dir: Path) -> list[str]:
    try:
        return sorted(name for name in os.listdir(state_dir) if name.endswith(".lease"))
    except FileNotFoundError:
        return []


def make_state_dir(path: Path) -> Path:
    return check_state_dir(path, create=True)


def write_raw(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write a file by hand with an exact mode (what an operator or a corruption would do)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)


def tombstone(lease: str, **fields: Any) -> LeaseRecord:
    now = time.time()
    values: dict[str, Any] = {
        "lease": lease,
        "name": container_name(lease),
        "state": "uncertain",
        "engine_socket": SOCKET,  # the daemon under test (a private one too)
        "registered_at": now - 30,
        "lifetime_deadline": now + 600,
        "memory_bytes": 64 * 1024 * 1024,
        "nano_cpus": 500_000_000,
        "reason": "create failed: connection to the Docker engine lost (test tombstone)",
        **fields,
    }
    return LeaseRecord(**values)


def cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def is_zombie(pid: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X")


def host_pids_with(*needles: bytes) -> list[int]:
    """Live host processes (any namespace) whose cmdline holds every needle; not us."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        line = cmdline(entry)
        if line and all(n in line for n in needles) and not is_zombie(entry):
            found.append(int(entry))
    return found


def supervisor_pids(state_dir: Path) -> list[int]:
    """Supervisor interpreters serving ``state_dir`` (not the /bin/sh that launched one)."""
    return [
        pid
        for pid in host_pids_with(b"sbxkit.supervisor", str(state_dir).encode())
        if not cmdline(str(pid)).startswith(b"/bin/sh")
    ]


def session_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[3])


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


class RawClient:
    """A bare AF_UNIX client speaking the wire protocol, byte for byte (no sbxkit client)."""

    def __init__(self, path: Path, timeout: float = 15.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.reader = FrameReader()
        self.pending: list[bytes] = []

    def send(self, message: Message) -> None:
        self.sock.sendall(encode(message))

    def receive(self) -> ServerMessage | None:
        """The next message, or None once the supervisor closed the connection."""
        while not self.pending:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.pending.extend(self.reader.feed(data))
        return decode_server(self.pending.pop(0))

    def drain(self) -> list[ServerMessage]:
        """Every message until the supervisor closes the connection."""
        messages: list[ServerMessage] = []
        while (message := self.receive()) is not None:
            messages.append(message)
        return messages

    def close(self) -> None:
        self.sock.close()


def hello() -> Hello:
    return Hello(protocol=PROTOCOL_VERSION, fingerprint=implementation_fingerprint())


def first_reply(socket_path: Path, message: Message) -> ServerMessage | None:
    """The supervisor's first answer to ``message``, sent after the handshake on a raw
    connection of its own (closed afterwards)."""
    client = RawClient(socket_path)
    try:
        client.send(hello())
        assert isinstance(client.receive(), Welcome)
        client.send(message)
        return client.receive()
    finally:
        client.close()


def register_for(lease: str, image: str, script: str, socket_path: str) -> Register:
    body = build_create_body(spec(image, script), lease)
    assert body.host_config is not None
    memory, nano_cpus = body.host_config.memory, body.host_config.nano_cpus
    assert memory is not None
    assert nano_cpus is not None
    return Register(
        lease=lease,
        name=container_name(lease),
        engine_socket=socket_path,
        body=body,
        reservation=Reservation(memory_bytes=memory, nano_cpus=nano_cpus),
        startup_deadline_s=30.0,
        lifetime_deadline_s=60.0,
    )


def records_gone(state_dir: Path, seconds: float = 10.0) -> bool:
    """The supervisor let every lease of the state dir go (within ``seconds``)."""
    return wait_until(lambda: not lease_files(state_dir), seconds)


def sbxkit_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sbxkit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


# --- a. useful work -----------------------------------------------------------------------------


async def test_useful_work_under_supervision_then_no_record(
    engine: Engine, busybox: str, witness: Witness, state_dir: Path
) -> None:
    marker = unique("useful")
    seen: list[LeaseRecord] = []

    async def watch_journal() -> None:
        state = StateDir(state_dir)
        while True:
            for path in state.record_paths():
                # A record may be deleted between listing and reading.
                with contextlib.suppress(FileNotFoundError, StorageError):
                    seen.append(state.read_record(path))
            await trio.sleep(0.02)

    with running_supervisor(state_dir) as sup:
        owner = SupervisedOwner(engine, state_dir=state_dir)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_journal)
            result = await run(
                spec(busybox, f"echo {marker}; echo to-stderr >&2; sleep 0.5; exit 7"),
                engine=engine,
                owner=owner,
            )
            nursery.cancel_scope.cancel()
        assert sup.proc.poll() is None
        # The run returned at the payload's exit; the supervisor removes, then lets go.
        assert await trio.to_thread.run_sync(
            lambda: wait_until(lambda: not lease_files(state_dir), 10.0)
        )

    assert result.status == "exited", result
    assert result.exit_code == 7
    assert result.stdout == f"{marker}\n".encode()
    assert result.stderr == b"to-stderr\n"
    # The journal really carried this lease while it ran, then let go of it.
    assert {r.lease for r in seen} == {result.lease}
    assert "created" in {r.state for r in seen}
    assert {r.container_id for r in seen if r.state == "created"} == {result.container_id}
    assert lease_files(state_dir) == []
    assert [n for n in os.listdir(state_dir) if n.startswith(".tmp-")] == []
    assert not container_exists(witness, result.container_id)
    assert witness.containers(label=f"{LEASE_LABEL}={result.lease}") == []
    assert containers_with_marker(witness, marker) == []


async def test_a_sigterm_finishes_the_removals_under_way(
    engine: Engine, busybox: str, witness: Witness, state_dir: Path
) -> None:
    """A run on the kernel path returns at its payload's exit with its removal still under way
    in the supervisor; a SIGTERM right then finishes that removal before the process ends,
    rather than leaving the container (and its record) to the next start."""
    with running_supervisor(state_dir, "--persistent") as sup:
        owner = SupervisedOwner(engine, state_dir=state_dir)
        result = await run(spec(busybox, "echo done"), engine=engine, owner=owner)
        sup.proc.terminate()
        await trio.to_thread.run_sync(lambda: sup.proc.wait(15))
    assert (result.status, result.evidence) == ("exited", "kernel"), result
    assert sup.proc.returncode == 0, sup.log()
    assert not container_exists(witness, result.container_id), sup.log()  # at once, no wait
    assert lease_files(state_dir) == []


# --- b. the caller is SIGKILLed mid-run ---------------------------------------------------------

TICKER = """
import os, sys, time
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    while True:  # detached grandchild: its own session, reparented to the container's init
        with open("/tmp/ticks", "a") as f:
            f.write("tick\\n")
        time.sleep(0.1)
os.waitpid(child, 0)
while True:
    time.sleep(0.2)
"""

CALLER = """
import sys
from pathlib import Path

import trio

from sbxkit.engine.client import open_engine
from sbxkit._consumers.runner import run
from sbxkit._model.spec import Limits, SandboxSpec
from sbxkit._lifecycle.supervised import SupervisedOwner

SPEC = SandboxSpec(
    image={image!r},
    command=["python3", "-c", {ticker!r}, {marker!r}],
    limits=Limits(cpus=0.5, memory_bytes=64 << 20, pids=64, output_bytes=1 << 20, timeout_s=60),
)


async def main() -> None:
    async with open_engine({socket!r}) as engine:
        owner = SupervisedOwner(engine, state_dir=Path({state_dir!r}))
        result = await run(SPEC, engine=engine, owner=owner)
    print("the run finished, which it must not:", result.status, flush=True)


trio.run(main)
"""


def detached_ticks(marker: str) -> int:
    """Ticks written by the payload's setsid() grandchild, read through its /proc root."""
    procs = processes_with_marker(marker)
    inits = [p for p in procs if p.is_container_init]
    if len(inits) != 1:
        return 0
    best = 0
    for proc in procs:
        if not proc.is_container_init and proc.session != inits[0].session:
            best = max(best, container_file_lines(proc.pid, "/tmp/ticks") or 0)
    return best


def test_caller_sigkilled_mid_run_container_gone_within_2s(
    python_image: str, witness: Witness, state_dir: Path, tmp_path: Path
) -> None:
    marker = unique("sigkill")
    script = tmp_path / "caller.py"  # the marker lives in the file, not in the caller's argv
    script.write_text(
        CALLER.format(
            image=python_image,
            ticker=TICKER,
            marker=marker,
            socket=witness.socket_path,
            state_dir=str(state_dir),
        )
    )
    output = tmp_path / "caller.out"
    with running_supervisor(state_dir) as sup, open(output, "wb") as out:
        caller = subprocess.Popen(
            [sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT
        )
        try:
            running: list[dict[str, Any]] = []

            def payload_ticking() -> bool:
                running[:] = [
                    c for c in containers_with_marker(witness, marker) if c["State"] == "running"
                ]
                return len(running) == 1 and detached_ticks(marker) >= 3

            assert wait_until(payload_ticking, 30.0), (output.read_text(), sup.log())
            container_id = running[0]["Id"]
            lease = running[0]["Labels"][LEASE_LABEL]
            assert lease_files(state_dir) == [record_filename(lease)]
            assert caller.poll() is None
            before_kill = detached_ticks(marker)

            elapsed = removal_after_sigkill(caller, witness, container_id)
        finally:
            if caller.poll() is None:
                caller.kill()
            caller.wait(10)

        print(f"\ncaller SIGKILLed mid-run -> container gone in {elapsed:.3f} s")
        assert elapsed < 2.0, f"container gone only {elapsed:.3f} s after the caller's SIGKILL"
        assert before_kill >= 3
        assert caller.returncode == -signal.SIGKILL
        assert "must not" not in output.read_text()

        # No host process carrying the marker survives (the setsid() grandchild included), and
        # none reappears while we watch.
        assert wait_until(lambda: not host_pids_with(marker.encode()), 2.0), host_pids_with(
            marker.encode()
        )
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert host_pids_with(marker.encode()) == []
            time.sleep(0.1)
        assert wait_until(lambda: lease_files(state_dir) == [], 2.0), lease_files(state_dir)
        assert sup.proc.poll() is None  # the supervisor outlives its caller's crash
    assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []
    assert containers_with_marker(witness, marker) == []


# --- c. the lifetime deadline with the caller still connected -----------------------------------


async def test_lifetime_deadline_removes_the_container_while_the_caller_is_connected(
    engine: Engine, busybox: str, witness: Witness, state_dir: Path
) -> None:
    """The supervisor removes the container at its lifetime deadline on its own; the caller's
    later ``remove`` then finds the buffered ``Closed`` and returns normally — consistent with
    wire.py: after ``Registered`` every lease ends in exactly one ``Closed`` (container gone,
    record deleted) or ``Orphaned``, and the removal was confirmed, so it is ``Closed``."""
    marker = unique("lifetime")
    lease = new_lease_id()
    name = container_name(lease)
    body = build_create_body(spec(busybox, f"sleep 30; echo {marker}"), lease)
    with running_supervisor(state_dir) as sup:
        owner = SupervisedOwner(engine, state_dir=state_dir)
        registered_before = time.monotonic()
        container_id = await owner.create(CreateRequest(lease, name, body, lifetime_s=1.5))
        await engine.container_start(container_id)
        assert [c["State"] for c in containers_with_marker(witness, marker)] == ["running"]
        assert lease_files(state_dir) == [record_filename(lease)]

        gone_at = await trio.to_thread.run_sync(container_gone_at, witness, container_id, 8.0)
        assert gone_at is not None, sup.log()
        elapsed = gone_at - registered_before
        print(f"\nlifetime 1.5 s -> container gone {elapsed:.3f} s after registration")
        assert 1.4 <= elapsed <= 3.0, elapsed
        assert wait_until(lambda: lease_files(state_dir) == [], 2.0)
        assert f"lease {lease}: lifetime deadline reached" in sup.log()

        # The connection is still open; the caller now releases the lease.
        outcome: str
        try:
            with trio.fail_after(10):
                await owner.remove(lease, name, container_id)
            outcome = "closed"
        except CleanupError as exc:
            outcome = f"cleanup error: {exc}"
        assert outcome == "closed"
        assert sup.proc.poll() is None
    assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []


# --- d. unsafe storage blocks execution ---------------------------------------------------------


def _bad_mode(path: Path) -> Path:
    make_state_dir(path)
    os.chmod(path, 0o755)
    return path


def _symlink(path: Path) -> Path:
    real = make_state_dir(path.parent / "real")
    path.symlink_to(real)
    return path


def _foreign(path: Path) -> Path:
    make_state_dir(path)
    os.chown(path, 65534, 65534)
    return path


@pytest.mark.parametrize(
    ("prepare", "problem"),
    [
        (_bad_mode, "has mode 0755; must be 0700"),
        (_symlink, "is a symbolic link"),
        (_foreign, "is owned by uid 65534"),
    ],
    ids=["mode-0755", "symlink-to-0700-dir", "foreign-owner"],
)
async def test_an_unsafe_state_dir_blocks_execution(
    engine: Engine,
    busybox: str,
    witness: Witness,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    prepare: Any,
    problem: str,
) -> None:
    prepare(state_dir)
    monkeypatch.setenv("SBXKIT_STATE_DIR", str(state_dir))
    marker = unique("unsafe-dir")
    with pytest.raises(StorageError) as refused:
        await run(spec(busybox, f"echo {marker}"), engine=engine)  # the default owner
    message = str(refused.value)
    assert str(state_dir) in message
    assert problem in message
    assert containers_with_marker(witness, marker) == []
    assert supervisor_pids(state_dir) == []  # refused before any helper was launched
    assert not (state_dir.parent / "real" / SOCKET_NAME).exists()


def _malformed(state_dir: Path) -> Path:
    path = state_dir / record_filename(new_lease_id())
    write_raw(path, b'{"version": 1, "lease": ')
    return path


def _mode_0644(state_dir: Path) -> Path:
    lease = new_lease_id()
    path = state_dir / record_filename(lease)
    write_raw(path, encode_record(tombstone(lease)), 0o644)
    return path


def _symlinked_record(state_dir: Path) -> Path:
    lease = new_lease_id()
    target = state_dir.parent / "elsewhere.lease"
    write_raw(target, encode_record(tombstone(lease)))
    path = state_dir / record_filename(lease)
    path.symlink_to(target)
    return path


@pytest.mark.parametrize(
    ("prepare", "problem"),
    [
        (_malformed, "malformed record"),
        (_mode_0644, "has mode 0644; must be 0600"),
        (_symlinked_record, "cannot open without following links"),
    ],
    ids=["malformed-json", "record-mode-0644", "record-symlink"],
)
async def test_an_unsafe_record_blocks_registration(
    engine: Engine,
    busybox: str,
    witness: Witness,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    prepare: Any,
    problem: str,
) -> None:
    make_state_dir(state_dir)
    bad = prepare(state_dir)
    contents = os.readlink(bad) if bad.is_symlink() else bad.read_bytes()
    monkeypatch.setenv("SBXKIT_STATE_DIR", str(state_dir))
    marker = unique("unsafe-record")
    with running_supervisor(state_dir) as sup:  # it starts, but refuses new leases
        assert "blocking new execution" in sup.log()
        with pytest.raises(SupervisorError) as refused:
            await run(spec(busybox, f"echo {marker}"), engine=engine)
        assert sup.proc.poll() is None
    assert refused.value.code == "storage"
    message = str(refused.value)
    assert str(bad) in message
    assert problem in message
    assert containers_with_marker(witness, marker) == []
    # The bad record is evidence for an operator: left exactly as it was.
    assert (os.readlink(bad) if bad.is_symlink() else bad.read_bytes()) == contents


# --- e. one supervisor per state dir ------------------------------------------------------------


async def test_a_second_supervisor_exits_0_and_leaves_the_first_undisturbed(
    engine: Engine, busybox: str, witness: Witness, state_dir: Path
) -> None:
    with running_supervisor(state_dir, "--persistent") as first:
        socket_path = state_dir / SOCKET_NAME
        before = os.lstat(socket_path)
        entries = [
            supervisor_command(state_dir),  # python -m sbxkit.supervisor
            [sys.executable, "-m", "sbxkit", "supervisor", "--state-dir", str(state_dir)],
        ]
        for argv in entries:
            second = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False
            )
            assert second.returncode == 0, second.stderr
            assert b"another supervisor holds" in second.stderr
            after = os.lstat(socket_path)
            assert (after.st_ino, after.st_ctime_ns) == (before.st_ino, before.st_ctime_ns)
            assert first.proc.poll() is None

        marker = unique("second")
        result = await run(
            spec(busybox, f"echo {marker}"),
            engine=engine,
            owner=SupervisedOwner(engine, state_dir=state_dir),
        )
        assert result.status == "exited"
        assert result.exit_code == 0
        assert result.stdout == f"{marker}\n".encode()
        assert os.lstat(socket_path).st_ino == before.st_ino
        assert first.log().count("listening on") == 1
        assert first.proc.poll() is None
        # Returned at the payload's exit: the first supervisor removes, then lets go.
        assert await trio.to_thread.run_sync(
            lambda: wait_until(lambda: not lease_files(state_dir), 10.0)
        )
    assert lease_files(state_dir) == []
    assert containers_with_marker(witness, marker) == []


# --- f. auto-launch -----------------------------------------------------------------------------

AUTO_CALLER = """
import trio
from sbxkit._consumers.runner import run
from sbxkit._model.spec import Limits, SandboxSpec

SPEC = SandboxSpec(
    image={image!r},
    command=["sh", "-c", "echo {marker}"],
    limits=Limits(cpus=0.5, memory_bytes=64 << 20, pids=64, output_bytes=1 << 20, timeout_s=20),
)
result = trio.run(lambda: run(SPEC, socket_path={socket!r}))
print(result.status, result.exit_code, result.stdout.decode().strip(), flush=True)
"""


def auto_caller(
    tmp_path: Path, image: str, marker: str, socket: str, state_dir: Path, idle_exit_s: float
) -> tuple[Path, dict[str, str]]:
    """``AUTO_CALLER`` as a script, and the environment that makes it auto-launch a supervisor
    on ``state_dir`` exiting ``idle_exit_s`` after it is idle."""
    script = tmp_path / "auto_caller.py"
    script.write_text(AUTO_CALLER.format(image=image, marker=marker, socket=socket))
    return script, {
        **os.environ,
        "SBXKIT_STATE_DIR": str(state_dir),
        "SBXKIT_SUPERVISOR": f"{sys.executable} -m sbxkit.supervisor --idle-exit {idle_exit_s:g}",
    }


def test_auto_launch_survives_its_caller_and_exits_when_idle(
    busybox: str, witness: Witness, state_dir: Path, tmp_path: Path
) -> None:
    marker = unique("autolaunch")
    script, env = auto_caller(tmp_path, busybox, marker, witness.socket_path, state_dir, 2)
    assert supervisor_pids(state_dir) == []
    caller = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    out, _ = caller.communicate(timeout=60)
    exited_at = time.monotonic()
    pids = supervisor_pids(state_dir)  # at once: the caller is gone, the helper is not

    assert caller.returncode == 0, out
    assert out.decode().split() == ["exited", "0", marker]
    assert len(pids) == 1, pids
    helper = pids[0]
    assert str(state_dir).encode() in cmdline(str(helper))
    assert parent_of(helper) != caller.pid
    assert session_of(helper) != os.getsid(0)  # a session of its own, not the caller's
    assert (state_dir / SOCKET_NAME).exists()

    assert wait_until(lambda: not supervisor_pids(state_dir), 10.0), "helper never exited"
    idle_exit = time.monotonic() - exited_at
    print(f"\nauto-launched helper exited {idle_exit:.2f} s after its caller (--idle-exit 2)")
    assert not (state_dir / SOCKET_NAME).exists()
    log = (state_dir / "supervisor.log").read_text()
    assert "idle and record-free; exiting" in log
    assert lease_files(state_dir) == []
    assert containers_with_marker(witness, marker) == []


def test_an_auto_launched_supervisor_runs_no_code_from_the_callers_directory(
    busybox: str, witness: Witness, state_dir: Path, tmp_path: Path
) -> None:
    """``sbxkit run`` in an untrusted checkout that plants ``sbxkit/supervisor/__main__.py``:
    the supervisor it launches starts isolated in ``/`` and imports the caller's sbxkit, so
    the planted module never runs (it ran with the supervisor's rights when the launch was
    ``python -m sbxkit.supervisor`` in the caller's directory)."""
    checkout = tmp_path / "checkout"
    (checkout / "sbxkit" / "supervisor").mkdir(parents=True)
    ran = tmp_path / "planted-module-ran"
    (checkout / "sbxkit" / "__init__.py").write_text("")
    (checkout / "sbxkit" / "supervisor" / "__init__.py").write_text("")
    (checkout / "sbxkit" / "supervisor" / "__main__.py").write_text(
        f"import os\nopen({str(ran)!r}, 'w').write(str(os.getuid()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"SBXKIT_SUPERVISOR", "PYTHONPATH"}}
    env["SBXKIT_STATE_DIR"] = str(state_dir)
    marker = unique("isolated")
    limits = ["--memory", "64m", "--timeout", "30s"]
    cli = str(Path(sys.executable).with_name("sbxkit"))  # the installed console script
    try:
        done = subprocess.run(
            [cli, "run", "--socket", SOCKET, *limits, busybox, "--", "echo", marker],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            stdin=subprocess.DEVNULL,
        )
        assert not ran.exists(), f"the planted module ran as uid {ran.read_text()}"
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [marker]
        pids = supervisor_pids(state_dir)
        assert len(pids) == 1, pids
        assert os.readlink(f"/proc/{pids[0]}/cwd") == "/"
    finally:
        launched = supervisor_pids(state_dir)
        for pid in launched:
            os.kill(pid, signal.SIGTERM)
        assert wait_until(lambda: not supervisor_pids(state_dir), 15.0), launched
    assert containers_with_marker(witness, marker) == []
    assert witness.sbxkit_containers() == []


# --- g. handshake mismatch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "greeting",
    [
        Hello(protocol=PROTOCOL_VERSION, fingerprint="0" * 32),
        Hello(protocol=PROTOCOL_VERSION + 1, fingerprint=implementation_fingerprint()),
    ],
    ids=["wrong-fingerprint", "wrong-protocol"],
)
def test_a_handshake_mismatch_is_refused(greeting: Hello, state_dir: Path) -> None:
    with running_supervisor(state_dir) as sup:
        client = RawClient(sup.socket_path)
        try:
            client.send(greeting)
            reply = client.receive()
            assert isinstance(reply, Refused), reply
            assert reply.code == "version"
            assert "drain the older supervisor before upgrading" in reply.reason
            assert greeting.fingerprint in reply.reason
            assert client.receive() is None  # and the connection is closed
        finally:
            client.close()
        # The supervisor itself is fine and still welcomes a matching client.
        good = RawClient(sup.socket_path)
        try:
            good.send(hello())
            welcome = good.receive()
            assert isinstance(welcome, Welcome)
            assert welcome.fingerprint == implementation_fingerprint()
        finally:
            good.close()
        assert sup.proc.poll() is None


def test_connections_that_only_say_hello_cannot_keep_a_run_out(
    state_dir: Path, busybox: str, witness: Witness
) -> None:
    """Idle greeters filled every connection slot for the handshake timeout and a real run was
    refused (``too many connections``, exit 75): at the cap, the connection greeting longest
    without a request gives its slot to the newcomer; a caller whose handshake is cut retries."""
    cap = 8
    with running_supervisor(state_dir, "--max-connections", str(cap)) as sup:
        idle = [RawClient(sup.socket_path) for _ in range(3 * cap)]
        try:
            for client in idle:
                with contextlib.suppress(OSError):
                    client.send(hello())
            marker = unique("past-greeters")
            env = {**os.environ, "SBXKIT_STATE_DIR": str(state_dir)}
            done = sbxkit_cli(
                "run", "--socket", SOCKET, "--memory", "64m", "--timeout", "30s", busybox,
                "--", "echo", marker, env=env,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == [marker]
            assert "dropped a connection still in its handshake" in sup.log()
        finally:
            for client in idle:
                client.close()
        assert sup.proc.poll() is None
    assert containers_with_marker(witness, marker) == []


# --- h. operator commands -----------------------------------------------------------------------


def test_leases_list_shows_records_and_flags_unsafe_ones(state_dir: Path) -> None:
    make_state_dir(state_dir)
    lease = new_lease_id()
    write_raw(state_dir / record_filename(lease), encode_record(tombstone(lease)))
    listed = sbxkit_cli("leases", "--state-dir", str(state_dir), "list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if lease in line]
    assert "uncertain" in row
    assert "test tombstone" in row

    broken = state_dir / record_filename(new_lease_id())
    write_raw(broken, b"not json")
    listed = sbxkit_cli("leases", "--state-dir", str(state_dir), "list")
    assert listed.returncode == 1
    assert lease in listed.stdout
    assert f"UNSAFE: supervisor state {broken}: malformed record" in listed.stdout


def test_leases_retire_needs_confirm_then_deletes_an_unobserved_tombstone(
    state_dir: Path, witness: Witness
) -> None:
    make_state_dir(state_dir)
    lease = new_lease_id()
    record_path = state_dir / record_filename(lease)
    write_raw(record_path, encode_record(tombstone(lease, engine_socket=witness.socket_path)))

    unconfirmed = sbxkit_cli("leases", "--state-dir", str(state_dir), "retire", lease)
    assert unconfirmed.returncode == 2
    assert "--confirm" in unconfirmed.stderr
    assert record_path.exists()

    with running_supervisor(state_dir) as sup:
        retired = sbxkit_cli("leases", "--state-dir", str(state_dir), "retire", lease, "--confirm")
        assert retired.returncode == 0, (retired.stderr, sup.log())
        assert f"daemon {witness.socket_path}: containers labelled " in retired.stdout
        assert f"{LEASE_LABEL}={lease}: 0" in retired.stdout
        assert f"containers named {container_name(lease)}: 0" in retired.stdout
        assert f"retired {lease}" in retired.stdout
        assert "records remaining: 0" in retired.stdout
        assert not record_path.exists()
        assert f"lease {lease}: tombstone retired by an operator" in sup.log()


def test_leases_retire_refuses_a_created_record_and_a_foreign_container_is_kept(
    state_dir: Path, witness: Witness, busybox: str
) -> None:
    """A ``created`` record is not a tombstone. Its container carries another lease's label, so
    recovery must never remove it either: the record stays for an operator."""
    make_state_dir(state_dir)
    lease, other = new_lease_id(), new_lease_id()
    response = witness.session.post(
        f"{witness.base}/containers/create",
        params={"name": unique("sbxt-foreign")},
        json={"Image": busybox, "Cmd": ["true"], "Labels": {LEASE_LABEL: other}},
        timeout=30,
    )
    response.raise_for_status()
    foreign_id: str = response.json()["Id"]
    record_path = state_dir / record_filename(lease)
    try:
        write_raw(
            record_path,
            encode_record(
                tombstone(
                    lease,
                    state="created",
                    container_id=foreign_id,
                    reason=None,
                    engine_socket=witness.socket_path,
                )
            ),
        )
        with running_supervisor(state_dir) as sup:
            assert wait_until(lambda: "belongs to another lease" in sup.log(), 10.0), sup.log()
            retired = sbxkit_cli(
                "leases", "--state-dir", str(state_dir), "retire", lease, "--confirm"
            )
            assert retired.returncode == 70, retired
            assert f"lease {lease} is created, not an uncertain tombstone" in retired.stderr
            time.sleep(1.2)  # at least two reaper passes (--reaper-interval 0.5)
            assert record_path.exists()
            assert container_exists(witness, foreign_id)
            assert sup.proc.poll() is None
    finally:
        witness.remove(foreign_id)
    assert not container_exists(witness, foreign_id)


def greet_and_register(client: RawClient, lease: str, image: str, witness: Witness) -> float:
    """The handshake, then a ``true`` sandbox's Register; when that was sent (monotonic)."""
    client.send(hello())
    assert isinstance(client.receive(), Welcome)
    sent = time.monotonic()
    client.send(register_for(lease, image, "true", witness.socket_path))
    return sent


def closed(client: RawClient, lease: str) -> None:
    """Close the lease and read until the supervisor closes the connection: it said Closed."""
    client.send(Close(lease=lease))
    assert any(isinstance(m, Closed) for m in client.drain())


def test_registered_comes_with_created_when_the_create_is_quick(
    state_dir: Path, witness: Witness, busybox: str
) -> None:
    """``Registered`` waits for ``Created`` and both come in one write (lifecycle.py,
    ``REGISTERED_HELD_S``): each write wakes the caller, whose wake takes a core from the
    supervisor's next step. ``waited_s`` says how long the lease waited for admission."""
    lease = new_lease_id()
    with running_supervisor(state_dir) as sup:
        client = RawClient(sup.socket_path)
        try:
            greet_and_register(client, lease, busybox, witness)
            client.pending.extend(client.reader.feed(client.sock.recv(65536)))
            arrived = [decode_server(frame) for frame in client.pending]
            assert [type(m) for m in arrived[:2]] == [Registered, Created], arrived
            registered, created = client.receive(), client.receive()
            assert isinstance(registered, Registered)
            assert registered.lease == lease
            assert 0 <= registered.waited_s < 1
            assert isinstance(created, Created)
            assert container_exists(witness, created.container_id)
            closed(client, lease)
        finally:
            client.close()
        assert not container_exists(witness, created.container_id)


def test_registered_goes_alone_when_the_create_is_slow(
    state_dir: Path, witness: Witness, busybox: str
) -> None:
    """A create the daemon holds (a proxy delays it 3 s): ``Registered`` does not wait for
    ``Created`` longer than ``REGISTERED_HELD_S``, so the caller hears its lease is owned (and
    waits the startup deadline for the container) well before its reply timeout."""
    lease = new_lease_id()
    with FaultProxy(witness.socket_path) as proxy:
        proxy.delay_create(3.0)
        with running_supervisor(state_dir, "--docker-socket", proxy.path) as sup:
            client = RawClient(sup.socket_path)
            try:
                sent = greet_and_register(client, lease, busybox, witness)
                registered = client.receive()
                heard_after = time.monotonic() - sent
                assert isinstance(registered, Registered), registered
                assert REGISTERED_HELD_S <= heard_after < 2.5, heard_after  # not with Created
                created = client.receive()
                assert isinstance(created, Created), created
                assert time.monotonic() - sent >= 3.0
                closed(client, lease)
            finally:
                client.close()
    assert not container_exists(witness, created.container_id)


# --- i. one lease per connection ----------------------------------------------------------------


def test_a_second_register_on_one_connection_drops_it_and_removes_the_first_lease(
    state_dir: Path, witness: Witness, busybox: str
) -> None:
    marker = unique("onelease")
    first, second = new_lease_id(), new_lease_id()
    since = time.time()
    with running_supervisor(state_dir) as sup:
        client = RawClient(sup.socket_path)
        try:
            client.send(hello())
            assert isinstance(client.receive(), Welcome)
            script = f"sleep 30; echo {marker}"
            client.send(register_for(first, busybox, script, witness.socket_path))
            registered = client.receive()
            assert isinstance(registered, Registered)
            assert registered.lease == first
            created = client.receive()
            assert isinstance(created, Created), created
            assert container_exists(witness, created.container_id)

            client.send(register_for(second, busybox, script, witness.socket_path))
            dropped_from = time.monotonic()
            rest = client.drain()  # returns only once the supervisor closed the connection
            dropped_after = time.monotonic() - dropped_from
        finally:
            client.close()
        assert dropped_after < 5.0
        assert not any(getattr(m, "lease", None) == second for m in rest), rest
        assert container_gone_at(witness, created.container_id, 5.0) is not None
        assert wait_until(lambda: lease_files(state_dir) == [], 2.0), lease_files(state_dir)
        assert "unexpected Register after registration" in sup.log()
        assert sup.proc.poll() is None
    # The second lease never reached the daemon: no container, no create event.
    assert witness.containers(label=f"{LEASE_LABEL}={second}") == []
    events = witness.events(since, time.time(), type=["container"], event=["create"])
    leases = {((e.get("Actor") or {}).get("Attributes") or {}).get(LEASE_LABEL) for e in events}
    assert second not in leases
    assert first in leases
    assert containers_with_marker(witness, marker) == []
