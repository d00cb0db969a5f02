"""Start and stop a real supervisor process for tests (not detached, so a test can kill it)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOCKET_NAME = "supervisor.sock"


def private_state_dir() -> Path:
    """A fresh 0700 state dir with a short path (AF_UNIX paths are capped at 108 bytes); its
    temporary parent goes when the test process ends, whoever forgot it (a supervisor
    stopped after a test's own ``rmtree`` can leave its lock and log behind)."""
    root = Path(tempfile.mkdtemp(prefix="sbxsup-", dir="/tmp"))
    os.chmod(root, 0o700)
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root / "leases"


def supervisor_command(state_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sbxkit.supervisor",
        "--state-dir",
        str(state_dir),
        "--idle-exit",
        "3",
        "--reaper-interval",
        "0.5",
        *extra,
    ]


class SupervisorProcess:
    def __init__(self, state_dir: Path, extra: tuple[str, ...]) -> None:
        self.state_dir = state_dir
        self.log_path = state_dir.parent / f"supervisor-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            supervisor_command(state_dir, *extra),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )

    @property
    def socket_path(self) -> Path:
        return self.state_dir / SOCKET_NAME

    def wait_ready(self, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited with {self.proc.returncode}: {self.log()}")
            if self.socket_path.exists() and "listening on" in self.log():
                return
            time.sleep(0.02)
        raise AssertionError(f"supervisor not ready within {seconds} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no cleanup code runs; the journal must carry recovery."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@contextmanager
def running_supervisor(state_dir: Path, *extra: str) -> Iterator[SupervisorProcess]:
    sup = SupervisorProcess(state_dir, extra)
    try:
        sup.wait_ready()
        yield sup
    finally:
        sup.stop()


def supervisor_pids(state_dir: Path) -> list[int]:
    """The pids of supervisor processes serving ``state_dir`` (auto-launched ones included),
    found by their command line."""
    wanted = str(state_dir).encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                argv = file.read().split(b"\0")
        except OSError:
            continue
        if b"sbxkit.supervisor" in argv and b"--state-dir" in argv and wanted in argv:
            found.append(int(entry))
    return found


def signal_supervisors(state_dir: Path, signum: int = signal.SIGKILL) -> list[int]:
    """Send ``signum`` to every supervisor of ``state_dir``; the pids signalled."""
    pids = supervisor_pids(state_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    return pids


def wait_gone(pids: list[int], seconds: float = 15.0) -> None:
    """Until none of ``pids`` runs any more (zombies of a test's own children count as gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _running(pid)]
        if not alive:
            return
        time.sleep(0.02)
    raise AssertionError(f"processes still running after {seconds} s: {alive}")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


@contextmanager
def auto_launched_supervisors(state_dir: Path) -> Iterator[None]:
    """Supervisors the callers of ``state_dir`` launch are stopped (SIGTERM, then SIGKILL)
    when the block ends: none outlives the test."""
    try:
        yield
    finally:
        pids = signal_supervisors(state_dir, signal.SIGTERM)
        try:
            wait_gone(pids, 12.0)
        except AssertionError:
            wait_gone(signal_supervisors(state_dir, signal.SIGKILL))
