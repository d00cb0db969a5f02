"""The network tier: real sandboxes on a daemon inside a network namespace with no route out.

Run by scripts/network-tier (``./dev test`` does), which makes the namespace, starts the daemon
in it and runs this directory under ``ip netns exec``. Outside it these tests FAIL, never skip:
a machine where they cannot run has not proven governed networking.

Every test ends with nothing left behind, checked independently of the code under test:
no container (tests/witness.py), no network but the daemon's own (and none sbxkit made that
the test did not remove), no setns thread, and no socket of another namespace still open in
the process that owned the lease (this one, or the supervisor): a listener bound inside a
sandbox that outlived it would be exactly that.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine, open_engine
from tests.network.servers import DnsWitness, Servers, running_servers
from tests.supervision import SupervisorProcess, private_state_dir
from tests.witness import BUSYBOX, PYTHON, Witness

TIER = os.environ.get("SBXKIT_NETWORK_TIER")
DAEMON_NETWORKS = {"host", "none"}
"""What a dockerd started with --bridge=none has before anyone creates a network."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session", autouse=True)
def tier() -> str:
    """The tier's namespace: named by scripts/network-tier, with no route out (proven here too)."""
    if not TIER:
        pytest.fail(
            "tests/network runs inside scripts/network-tier (./dev test runs it): it needs the "
            "tier's network namespace and daemon; it never skips",
            pytrace=False,
        )
    route = subprocess.run(["ip", "route", "get", "1.1.1.1"], capture_output=True, check=False)
    if route.returncode == 0:
        pytest.fail(f"this namespace routes to 1.1.1.1: {route.stdout!r}", pytrace=False)
    if os.stat("/proc/self/ns/net").st_ino != os.stat(f"/run/netns/{TIER}").st_ino:
        pytest.fail(f"this process is not in the tier's namespace {TIER}", pytrace=False)
    return TIER


@pytest.fixture(scope="session")
def witness(tier: str) -> Witness:
    w = Witness()
    if not w.ping():
        pytest.fail(f"no daemon answers on {w.socket_path} inside {tier}", pytrace=False)
    for image in (BUSYBOX, PYTHON):
        if not w.image_exists(image):
            pytest.fail(f"test image {image} is missing in the tier's daemon", pytrace=False)
    return w


@pytest.fixture(scope="session")
def servers(tier: str) -> Iterator[Servers]:
    with (
        tempfile.TemporaryDirectory(prefix="sbxnet-") as directory,
        running_servers(Path(directory)) as running,
    ):
        yield running


@pytest.fixture(scope="session")
def dns(tier: str) -> Iterator[DnsWitness]:
    witness = DnsWitness()
    yield witness
    witness.close()


LAUNCHER_UMASK = 0o077
"""What an auto-launched supervisor runs with (sbxkit/_lifecycle/launch.py): the tier's
supervisors run as a user's would, not with the test process's umask (issue 38: a 0700 TLS
directory broke the https callback on the default path, and no test saw it)."""


@contextmanager
def supervisor_with_umask(state_dir: Path, umask: int, *extra: str) -> Iterator[SupervisorProcess]:
    """A supervisor as ``running_supervisor`` starts one, under ``umask`` (inherited at fork:
    set in this process around the start only)."""
    previous = os.umask(umask)
    try:
        process = SupervisorProcess(state_dir, extra)
    finally:
        os.umask(previous)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def supervisor(tier: str) -> Iterator[SupervisorProcess]:
    """One supervisor for the tier's supervised tests (its pid is what the socket check
    reads), with the umask the launcher gives an auto-launched one."""
    state_dir = private_state_dir()
    with supervisor_with_umask(state_dir, LAUNCHER_UMASK, "--idle-exit", "600") as process:
        yield process


_SOCKET = re.compile(r"socket:\[(\d+)\]")
_SIOCGSKNS = 0x894C
"""ioctl on a socket: a new fd of the network namespace the socket belongs to (Linux 4.9)."""
_PIDFD_GETFD = 438
"""syscall number (x86_64, Linux 5.6): a duplicate of another process's fd."""
_libc = ctypes.CDLL(None, use_errno=True)


def foreign_sockets(pid: int) -> set[int]:
    """Socket inodes ``pid`` holds that belong to another network namespace (a sandbox's
    listener still open after the sandbox), asked of each socket itself.

    Not by elimination against ``/proc/PID/net/*``: a TCP socket whose peer reset it is in
    CLOSE and in no table, though it is of this namespace (a test upstream's handler holding
    a connection a killed proxy reset read as "foreign" once)."""
    own = os.stat(f"/proc/{pid}/ns/net").st_ino
    foreign: set[int] = set()
    pidfd = os.pidfd_open(pid)
    try:
        for entry in Path(f"/proc/{pid}/fd").iterdir():
            try:
                match = _SOCKET.fullmatch(os.readlink(entry))
            except OSError:
                continue
            if not match:
                continue
            copy = _libc.syscall(_PIDFD_GETFD, pidfd, int(entry.name), 0)
            if copy < 0:
                continue  # closed since the listing
            try:
                namespace = fcntl.ioctl(copy, _SIOCGSKNS)
            except OSError:
                continue
            finally:
                os.close(copy)
            try:
                if os.fstat(namespace).st_ino != own:
                    foreign.add(int(match.group(1)))
            finally:
                os.close(namespace)
    finally:
        os.close(pidfd)
    return foreign


def sbxkit_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sbxkit-setns")]


@pytest.fixture(autouse=True)
def nothing_left_behind(
    witness: Witness, servers: Servers, dns: DnsWitness, supervisor: SupervisorProcess
) -> Iterator[None]:
    before = witness.sbxkit_containers()
    if before:
        pytest.fail(f"sbxkit containers exist before the test: {[c['Id'][:12] for c in before]}")
    servers.clear()
    dns.clear()
    pids = (os.getpid(), supervisor.proc.pid)
    yield
    problems: list[str] = []
    left = witness.wait_until_no_sbxkit_containers(seconds=10.0)
    if left:
        for container in left:
            witness.remove(container["Id"])
        problems.append(f"leaked containers: {[c['Id'][:12] for c in left]}")
    networks = {n["Name"] for n in witness.get("/networks")} - DAEMON_NETWORKS
    if networks:
        problems.append(f"networks left: {sorted(networks)}")
    if sbxkit_threads():
        problems.append(f"threads left: {sbxkit_threads()}")
    for pid in pids:
        leaked = _settled(lambda pid=pid: foreign_sockets(pid))
        if leaked:
            problems.append(f"process {pid} still holds sockets of another namespace: {leaked}")
    if problems:
        pytest.fail("; ".join(problems))


def _settled(probe: Any, seconds: float = 5.0) -> Any:
    """The probe's answer once it is empty, or its last answer after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture
async def engine(witness: Witness) -> AsyncIterator[Engine]:
    async with open_engine(witness.socket_path) as opened:
        yield opened


@pytest.fixture(params=["supervised", "in_process"])
async def backend(
    request: pytest.FixtureRequest, engine: Engine, supervisor: SupervisorProcess
) -> DockerBackend:
    """The lease's owner, and so the proxy's home: the supervisor, or this process."""
    if request.param == "supervised":
        settings = Settings(supervisor_state_dir=str(supervisor.state_dir))
        return DockerBackend(engine=engine, settings=settings, recover_at_open=False)
    return DockerBackend(engine=engine, owner=InProcessOwner(engine))


def supervised(supervisor: SupervisorProcess, engine: Engine, **settings: Any) -> DockerBackend:
    return DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(supervisor.state_dir), **settings),
        recover_at_open=False,
    )
