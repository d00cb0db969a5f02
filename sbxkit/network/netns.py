"""Entering a started sandbox from the host: listeners on its loopback, files it reads.

The thin I/O shell under the governor (docs/network.md). A sandbox with ``NetworkMode: none``
has a network namespace of its own holding only loopback. A host process with
``CAP_SYS_ADMIN`` opens a pidfd of the sandbox's init, calls ``setns(pidfd, CLONE_NEWNET)`` in
a *fresh* thread (Python 3.11 has no ``os.setns``: ``ctypes``), binds and listens, and the
thread ends: the sockets stay in the sandbox's namespace, the rest of the process never
leaves its own. The thread is never a pooled worker, so a failed switch back cannot leak into
other work. The same pidfd guards every other step: the process is checked to be the
container's (its cgroup names the container, its network namespace is not ours) and still
alive after each path under ``/proc/PID`` was opened, so a reused pid is never entered.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import trio

from sbxkit._kernel.userns import outside_id, parse_id_map
from sbxkit._model.network_terms import TLS_MOUNT, TlsBundle
from sbxkit.engine.client import Engine
from sbxkit.errors import NetworkUnavailable

__all__ = [
    "NetworkUnavailable",
    "SandboxProcess",
    "add_hosts_entries",
    "bind_in_sandbox",
    "can_enter_namespaces",
    "open_sandbox_process",
    "socket_in_sandbox",
    "write_broker_files",
    "write_tls_bundle",
]

CLONE_NEWNET = 0x40000000
CAP_SYS_ADMIN = 21
LISTEN_BACKLOG = 128
_T = TypeVar("_T")


def can_enter_namespaces(status_text: str | None = None) -> bool:
    """Whether this process holds CAP_SYS_ADMIN (``CapEff`` in ``/proc/self/status``)."""
    if status_text is None:
        try:
            with open("/proc/self/status", encoding="ascii") as handle:
                status_text = handle.read()
        except OSError:
            return False
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    return False


class SandboxProcess:
    """The sandbox's init, held by a pidfd for as long as the governor enters it."""

    def __init__(self, pid: int, pidfd: int, hosts_path: str) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.hosts_path = hosts_path

    def alive(self) -> bool:
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


def _namespace_inode(path: str) -> int:
    return os.stat(path).st_ino


def process_problem(container_id: str, cgroup_text: str, netns: int, own_netns: int) -> str | None:
    """Why a host pid is not the started sandbox's init (pure; the caller read the files)."""
    if container_id not in cgroup_text:
        return (
            "its process is not in the container's cgroup here: the daemon does not share "
            "this host's kernel and pid space (a remote or VM-backed daemon)"
        )
    if netns == own_netns:
        return "its process shares this host's network namespace"
    return None


async def open_sandbox_process(engine: Engine, container_id: str) -> SandboxProcess:
    """A pidfd of the running sandbox's init, checked to be that container's."""
    info = await engine.container_inspect(container_id)
    if not info.state.running or info.state.pid <= 0:
        raise NetworkUnavailable(f"the sandbox is {info.state.status}, not running")
    pid = info.state.pid
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise NetworkUnavailable(f"cannot open the sandbox's process {pid}: {exc}") from exc
    process = SandboxProcess(pid, pidfd, info.hosts_path)
    try:
        again = await engine.container_inspect(container_id)
        if not again.state.running or again.state.pid != pid:
            raise NetworkUnavailable("the sandbox's process changed while it was being entered")

        def read_identity() -> tuple[str, int, int]:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            return (
                text,
                _namespace_inode(f"/proc/{pid}/ns/net"),
                _namespace_inode("/proc/self/ns/net"),
            )

        try:
            cgroup, netns, own = await trio.to_thread.run_sync(read_identity)
        except OSError as exc:
            raise NetworkUnavailable(f"cannot read the sandbox's process {pid}: {exc}") from exc
        problem = process_problem(container_id, cgroup, netns, own)
        if problem is None and not process.alive():
            problem = "the sandbox's process ended while it was being entered"
        if problem is not None:
            raise NetworkUnavailable(problem)
    except BaseException:
        process.close()
        raise
    return process


def _libc_setns() -> Callable[[int, int], int]:
    libc = ctypes.CDLL(None, use_errno=True)
    setns: Callable[[int, int], int] = libc.setns
    return setns


def _in_fresh_thread(work: Callable[[], _T]) -> _T:
    """Run ``work`` in a thread of its own that ends with it (never a pooled worker)."""
    result: list[_T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name="sbxkit-setns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _bind_all(pidfd: int, addresses: Sequence[tuple[str, int]]) -> list[socket.socket]:
    setns = _libc_setns()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    sockets: list[socket.socket] = []
    try:
        if setns(pidfd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NetworkUnavailable(
                f"cannot enter the sandbox's network namespace: {os.strerror(code)}"
                + (" (needs CAP_SYS_ADMIN on this host)" if code == errno.EPERM else "")
            )
        try:
            for host, port in addresses:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                listener = socket.socket(family, socket.SOCK_STREAM)
                sockets.append(listener)
                # A restarted owner binds again where its dead predecessor's connections may
                # linger in TIME_WAIT (re-adoption); it never shares a port with a listener.
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((host, port))
                listener.listen(LISTEN_BACKLOG)
                listener.setblocking(False)
        finally:
            setns(own, CLONE_NEWNET)  # this thread ends next either way
    except BaseException:
        for listener in sockets:
            listener.close()
        raise
    finally:
        os.close(own)
    return sockets


async def bind_in_sandbox(
    process: SandboxProcess, addresses: Sequence[tuple[str, int]]
) -> list[socket.socket]:
    """Listening sockets in the sandbox's network namespace, one per ``(host, port)``."""
    try:
        sockets = await trio.to_thread.run_sync(
            _in_fresh_thread, lambda: _bind_all(process.pidfd, addresses)
        )
    except OSError as exc:
        raise NetworkUnavailable(f"cannot listen inside the sandbox: {exc}") from exc
    if not process.alive():
        for listener in sockets:
            listener.close()
        raise NetworkUnavailable("the sandbox's process ended while its listeners were bound")
    return sockets


def _socket_in(pidfd: int, family: int) -> socket.socket:
    setns = _libc_setns()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if setns(pidfd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NetworkUnavailable(
                f"cannot enter the sandbox's network namespace: {os.strerror(code)}"
            )
        try:
            made = socket.socket(family, socket.SOCK_STREAM)
        finally:
            setns(own, CLONE_NEWNET)  # this thread ends next either way
    finally:
        os.close(own)
    made.setblocking(False)
    return made


async def socket_in_sandbox(process: SandboxProcess, family: int) -> socket.socket:
    """An unconnected TCP socket of the sandbox's network namespace (a socket belongs to the
    namespace it was made in, whoever connects it): an inbound port's way to the sandbox's own
    loopback. The pidfd, not a held namespace file, names the namespace, so a sandbox whose
    init ended is never entered (``setns`` fails) and nothing keeps its namespace alive."""
    try:
        made = await trio.to_thread.run_sync(
            _in_fresh_thread, functools.partial(_socket_in, process.pidfd, family)
        )
    except OSError as exc:
        raise NetworkUnavailable(f"cannot open a socket inside the sandbox: {exc}") from exc
    if not process.alive():
        made.close()
        raise NetworkUnavailable("the sandbox's process ended")
    return made


async def add_hosts_entries(process: SandboxProcess, names: Sequence[str]) -> None:
    """Map ``names`` to 127.0.0.1 in the sandbox's ``/etc/hosts``: the daemon's own file for
    the container (bind-mounted read-only into it; ``ExtraHosts`` is not written under
    ``NetworkMode: none``), appended in place before the payload runs. A line already there
    (a restarted owner re-adopting the sandbox) is not written twice."""
    if not names:
        return
    if not process.hosts_path.startswith("/"):
        raise NetworkUnavailable("the daemon reports no hosts file for the sandbox")
    wanted = [f"127.0.0.1\t{name}\n".encode("ascii") for name in names]

    def append() -> None:
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(process.hosts_path, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NetworkUnavailable("the sandbox's hosts file is not a regular file")
            present = set(os.pread(fd, HOSTS_READ_LIMIT, 0).splitlines(keepends=True))
            os.write(fd, b"".join(line for line in wanted if line not in present))
        finally:
            os.close(fd)

    try:
        await trio.to_thread.run_sync(append)
    except OSError as exc:
        raise NetworkUnavailable(f"cannot name the callback in the sandbox: {exc}") from exc


HOSTS_READ_LIMIT = 1024 * 1024
_FILE_MODES = (("ca", "ca.pem", 0o444), ("cert", "cert.pem", 0o444), ("key", "key.pem", 0o400))
TLS_DIR_MODE = 0o755
"""The bundle's directory: root's, searchable by the sandbox user, writable by no one else."""


def _host_ids(process: SandboxProcess, uid: int, gid: int) -> tuple[int, int]:
    """The host's ids for the sandbox user's: the same, unless the daemon remaps user
    namespaces (its container ids are then subordinate host ids, read from the init's maps,
    which are read before the pid is checked to be the sandbox's still)."""
    found = []
    for kind, inside in (("uid", uid), ("gid", gid)):
        try:
            with open(f"/proc/{process.pid}/{kind}_map", encoding="ascii") as handle:
                outside = outside_id(parse_id_map(handle.read()), inside)
        except (OSError, ValueError) as exc:
            raise NetworkUnavailable(f"cannot read the sandbox's {kind} map: {exc}") from exc
        if outside is None:
            raise NetworkUnavailable(f"the sandbox's {kind} {inside} maps to no host id")
        found.append(outside)
    if not process.alive():
        raise NetworkUnavailable("the sandbox's process ended before its ids were read")
    return found[0], found[1]


def _write_bundle(process: SandboxProcess, bundle: TlsBundle, uid: int, gid: int) -> None:
    files = [
        (name, data, mode)
        for attribute, name, mode in _FILE_MODES
        if (data := getattr(bundle, attribute)) is not None
    ]
    _write_files(process, "tls", files, uid, gid, replace=False)


def _write_files(
    process: SandboxProcess,
    subdir: str,
    files: list[tuple[str, bytes, int]],
    uid: int,
    gid: int,
    *,
    replace: bool,
) -> None:
    """Into the sandbox's own ``TLS_MOUNT`` tmpfs, component by component without following a
    link (the image could hold one), checked to be a mount of its own; owned by the sandbox
    user as the host knows it (``_host_ids``). Run in a thread of its own: where the daemon
    remaps user namespaces, the tmpfs belongs to the sandbox's namespace, in which host root is
    no one (a create as host root fails, ``EOVERFLOW``), so this thread creates as the sandbox's
    root (its filesystem ids, ``_creating_as``) and chowns as host root again. ``replace``: a
    directory already there gets the files anew (each written beside, then renamed over)."""
    creator = _host_ids(process, 0, 0)
    uid, gid = _host_ids(process, uid, gid)
    nofollow = os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
    root = os.open(f"/proc/{process.pid}/root", os.O_DIRECTORY | os.O_CLOEXEC)
    opened = [root]
    try:
        if not process.alive():  # the pid was not reused before its root was opened
            raise NetworkUnavailable("the sandbox's process ended before its files were written")
        directory = root
        for part in TLS_MOUNT.strip("/").split("/"):
            directory = os.open(part, nofollow, dir_fd=directory)
            opened.append(directory)
        if os.fstat(directory).st_dev == os.fstat(root).st_dev:
            raise NetworkUnavailable(f"{TLS_MOUNT} in the sandbox is not sbxkit's tmpfs")
        written: list[tuple[int, int]] = []
        with _creating_as(*creator):
            try:
                os.mkdir(subdir, 0o700, dir_fd=directory)
            except FileExistsError:
                # Only an owner of this lease makes it (the payload cannot write in root's
                # tmpfs, unless it is that root: a workspace's, whose bundle it is anyway): a
                # restarted owner re-adopting the sandbox leaves it as it is, unless told.
                if not replace:
                    return
            target = os.open(subdir, nofollow, dir_fd=directory)
            opened.append(target)
            # Explicit, whatever the owner's umask: an auto-launched supervisor runs with 077,
            # which left the directory 0700 and the payload unable to read its own CA.
            os.fchmod(target, TLS_DIR_MODE)
            for name, data, mode in files:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                temporary = f".{name}.new"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=target)
                fd = os.open(temporary, flags, 0o600, dir_fd=target)
                opened.append(fd)
                os.write(fd, data)
                written.append((fd, mode))
        for fd, mode in written:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        with _creating_as(*creator):  # a rename creates a name: host root is no one there too
            for name, _data, _mode in files:
                os.replace(f".{name}.new", name, src_dir_fd=target, dst_dir_fd=target)
    finally:
        for fd in reversed(opened):
            os.close(fd)


@contextlib.contextmanager
def _creating_as(uid: int, gid: int) -> Iterator[None]:
    """This thread's filesystem ids for the block (Linux keeps them per thread); host root's
    again after it, which gives back the capabilities a non-zero fsuid drops."""
    if (uid, gid) == (0, 0):
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsgid(gid)
    libc.setfsuid(uid)
    try:
        # setfsuid answers the id before the call: asked again, the id it took
        if libc.setfsuid(uid) != uid or libc.setfsgid(gid) != gid:
            raise NetworkUnavailable(f"cannot create files as the sandbox's root ({uid}:{gid})")
        yield
    finally:
        libc.setfsuid(0)
        libc.setfsgid(0)


async def write_broker_files(
    process: SandboxProcess, files: list[tuple[str, bytes]], uid: int, gid: int
) -> None:
    """The broker CA's certificate and the trust bundle (never a key), readable by anyone in
    the sandbox, in ``/run/sbxkit/broker``; written anew by a re-adopting owner, whose CA is a
    new one."""
    entries = [(name, data, 0o444) for name, data in files]
    try:
        await trio.to_thread.run_sync(
            _in_fresh_thread,
            functools.partial(_write_files, process, "broker", entries, uid, gid, replace=True),
        )
    except OSError as exc:
        raise NetworkUnavailable(f"cannot put the broker CA in the sandbox: {exc}") from exc


async def write_tls_bundle(process: SandboxProcess, bundle: TlsBundle, uid: int, gid: int) -> None:
    """The client TLS bundle as the sandbox user's files: the key readable by that user
    alone (0400), the certificates by anyone (0444), in a directory only root may change;
    once per sandbox (a directory already there is a previous owner's, left as it is)."""
    try:
        await trio.to_thread.run_sync(
            _in_fresh_thread, functools.partial(_write_bundle, process, bundle, uid, gid)
        )
    except OSError as exc:
        raise NetworkUnavailable(f"cannot put the TLS bundle in the sandbox: {exc}") from exc
