"""Shared helpers for the real-engine behaviour tests (hardening, outcomes, CLI).

Specs are built with small, explicit limits; anything that proves what the daemon did (containers,
events, images) goes through the independent witness, never through sbxkit's own client, and
anything that proves what processes exist goes through the host's /proc.
"""

from __future__ import annotations

import io
import os
import secrets
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import requests

from sbxkit._lifecycle.owned import created_inspection
from sbxkit._lifecycle.owner import CreateRequest, Owner
from sbxkit._model.result import RunResult
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._protocol.wire import Expiring
from sbxkit.engine.models import ContainerInspect
from tests.engine.runtimes import min_pids
from tests.witness import RUN_LABEL, THIS_RUN, Witness

BASE_LIMITS: dict[str, Any] = {
    "cpus": 0.5,
    "memory_bytes": 64 * MiB,
    "pids": 64,
    "output_bytes": MiB,
    "timeout_s": 20.0,
}
"""Sane small limits; each test overrides only the one it is about."""


def limits(**overrides: Any) -> Limits:
    return msgspec.convert({**BASE_LIMITS, **overrides}, Limits)


def runtime_limits(runtime: str | None, **overrides: Any) -> Limits:
    """BASE_LIMITS with ``overrides``; the pids default is raised to the runtime's floor."""
    if "pids" not in overrides:
        overrides["pids"] = max(BASE_LIMITS["pids"], min_pids(runtime))
    return limits(**overrides)


def spec(
    image: str,
    script: str,
    *,
    env: dict[str, str] | None = None,
    runtime: str | None = None,
    **overrides: Any,
) -> SandboxSpec:
    """``sh -c script`` in ``image`` under BASE_LIMITS with ``overrides``."""
    return SandboxSpec(
        image=image,
        command=["sh", "-c", script],
        limits=runtime_limits(runtime, **overrides),
        env=env or {},
        runtime=runtime,
    )


def python_spec(
    image: str,
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    runtime: str | None = None,
    **overrides: Any,
) -> SandboxSpec:
    """``python3 -c code args...`` in ``image`` under BASE_LIMITS with ``overrides``."""
    return SandboxSpec(
        image=image,
        command=["python3", "-c", code, *args],
        limits=runtime_limits(runtime, **overrides),
        env=env or {},
        runtime=runtime,
    )


def fill_half_then_double(directory: str) -> str:
    """A script writing half of a 1 MiB limit into ``directory`` (then removing it), then
    double the limit; ``assert_half_fits_double_does_not`` reads its result."""
    return (
        f"dd if=/dev/zero of={directory}/half bs=64k count=8 && echo half=ok; "
        f"wc -c < {directory}/half; rm -f {directory}/half; "
        f"dd if=/dev/zero of={directory}/double bs=64k count=32; echo double=$?"
    )


def assert_half_fits_double_does_not(result: RunResult) -> None:
    assert result.status == "exited", result
    lines = text(result.stdout).split()
    assert "half=ok" in lines  # the positive control: the place is there and writable
    assert str(512 * 1024) in lines
    assert "double=0" not in lines
    assert any(line.startswith("double=") for line in lines), lines
    assert "No space left" in text(result.stderr)


SIGINT_AT_DEFAULT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
"""The first line of a child script a test sends SIGINT: a program started from a terminal has
SIGINT at its default, which Python turns into ``KeyboardInterrupt``. A test run launched as a
background job of a shell without job control hands its children SIGINT *ignored*, and Python
leaves an inherited ignore alone — the Ctrl-C tests then waited out their payload's 60 s."""


def unique(prefix: str = "sbxt") -> str:
    """A name nobody else uses: prefix plus 64 random bits."""
    return f"{prefix}-{secrets.token_hex(8)}"


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def wait_until(predicate: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``seconds`` passed; return its last value."""
    deadline = time.monotonic() + seconds
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


# --- host process table ------------------------------------------------------------------------


class HostProcess(msgspec.Struct, frozen=True):
    pid: int
    ns_pids: tuple[int, ...]
    """NSpid: the pid in each pid namespace, outermost first (length 1 = a host process)."""
    session: int

    @property
    def in_container(self) -> bool:
        return len(self.ns_pids) > 1

    @property
    def is_container_init(self) -> bool:
        return self.ns_pids[-1] == 1


def _read_process(pid: int) -> HostProcess | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    ns_pids: tuple[int, ...] = (pid,)
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            ns_pids = tuple(int(x) for x in line.split()[1:])
    return HostProcess(pid=pid, ns_pids=ns_pids, session=int(fields[3]))


def processes_with_marker(marker: str) -> list[HostProcess]:
    """Host processes inside some container whose command line contains ``marker``."""
    needle = marker.encode()
    found: list[HostProcess] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            proc = _read_process(int(entry))
            if proc is not None and proc.in_container:
                found.append(proc)
    return found


def container_file_lines(pid: int, path: str) -> int | None:
    """Lines of ``path`` as seen by host process ``pid`` (through /proc/PID/root), if readable."""
    try:
        return Path(f"/proc/{pid}/root{path}").read_bytes().count(b"\n")
    except OSError:
        return None


# --- the witness, beyond what tests/witness.py offers ----------------------------------------


def container_exists(witness: Witness, container_id: str) -> bool:
    """GET /containers/{id}/json through the witness: 200 → True, 404 → False, else raise.

    Podman answers a container removed while it looks with 500 and cause "no such container":
    that is "gone" too."""
    response = witness.session.get(f"{witness.base}/containers/{container_id}/json", timeout=30)
    if response.status_code == 404 or (
        response.status_code == 500 and '"cause":"no such container"' in response.text
    ):
        return False
    response.raise_for_status()
    return True


def container_gone_at(witness: Witness, container_id: str, seconds: float) -> float | None:
    """Poll the witness tightly; the monotonic time the container was first seen gone (None:
    still there after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not container_exists(witness, container_id):
            return time.monotonic()
        time.sleep(0.01)
    return None


def removal_after_sigkill(
    caller: subprocess.Popen[bytes], witness: Witness, container_id: str
) -> float:
    """SIGKILL ``caller``, then the seconds until its container is gone (at most 10)."""
    killed_at = time.monotonic()
    caller.send_signal(signal.SIGKILL)
    gone_at = container_gone_at(witness, container_id, 10.0)
    assert gone_at is not None, f"container {container_id[:12]} outlived its killed caller"
    return gone_at - killed_at


def containers_with_marker(witness: Witness, marker: str) -> list[dict[str, Any]]:
    """Containers (any state) whose command or a label contains ``marker``, or running ones
    with a process that carries it (a pooled run's command arrives after start; the pooled
    test path also labels it) — robust to other tenants."""
    return [
        c
        for c in witness.containers()
        if marker in (c.get("Command") or "")
        or marker in " ".join((c.get("Labels") or {}).values())
        or (c.get("State") == "running" and runs_marker(witness, c["Id"], marker))
    ]


def runs_marker(witness: Witness, container_id: str, marker: str) -> bool:
    """A process of the container carries ``marker`` in its command line (False: it stopped)."""
    try:
        rows = witness.get(f"/containers/{container_id}/top")["Processes"] or []
    except Exception:  # stopped or removed between the listing and this call
        return False
    return any(marker in " ".join(row) for row in rows)


def tag_image(witness: Witness, source: str, repo: str, tag: str) -> str:
    """Tag ``source`` as ``repo:tag`` through the witness; return the new reference."""
    response = witness.session.post(
        f"{witness.base}/images/{source}/tag", params={"repo": repo, "tag": tag}, timeout=30
    )
    response.raise_for_status()
    return f"{repo}:{tag}"


def delete_image(witness: Witness, reference: str) -> None:
    """Remove an image reference through the witness (404: already gone).

    Never forced: for a reference that shares its image with other tags this only untags it.
    """
    response = witness.session.delete(f"{witness.base}/images/{reference}", timeout=30)
    if response.status_code != 404:
        response.raise_for_status()


def create_plain_container(witness: Witness, image: str, name: str) -> str:
    """A stopped helper container the witness owns: no sbxkit name prefix, no lease label."""
    assert not name.startswith("sbxkit-")
    response = witness.session.post(
        f"{witness.base}/containers/create",
        params={"name": name},
        json={"Image": image, "Cmd": ["true"], "Labels": {"sbxkit-tests.helper": "1"}},
        timeout=30,
    )
    response.raise_for_status()
    container_id: str = response.json()["Id"]
    return container_id


def commit_with_volume(witness: Witness, container_id: str, repo: str, tag: str) -> str:
    """Commit ``container_id`` as ``repo:tag`` with ``VOLUME /data``; return the reference."""
    response = witness.session.post(
        f"{witness.base}/commit",
        params={"container": container_id, "repo": repo, "tag": tag, "changes": "VOLUME /data"},
        timeout=60,
    )
    response.raise_for_status()
    return f"{repo}:{tag}"


def image_with_files(
    witness: Witness, base: str, files: Mapping[str, bytes], repo: str, *, executable: bool = False
) -> str:
    """``base`` plus ``files`` (names relative to ``/``), committed as ``repo:UNIQUE`` through
    the witness: a task image a test makes for itself. ``executable``: ``*.sh`` files 0755."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            script = executable and name.endswith(".sh")
            info.size, info.mode = len(data), 0o755 if script else 0o644
            tar.addfile(info, io.BytesIO(data))
    tag = unique("img")
    container = create_plain_container(witness, base, tag)
    try:
        put = witness.session.put(
            f"{witness.base}/containers/{container}/archive",
            params={"path": "/"},
            data=archive.getvalue(),
            headers={"Content-Type": "application/x-tar"},
            timeout=60,
        )
        put.raise_for_status()
        commit = witness.session.post(
            f"{witness.base}/commit",
            params={"container": container, "repo": repo, "tag": tag},
            timeout=60,
        )
        commit.raise_for_status()
    finally:
        witness.session.delete(f"{witness.base}/containers/{container}", timeout=30)
    return f"{repo}:{tag}"


def image_volumes(witness: Witness, reference: str) -> dict[str, Any]:
    info = witness.get(f"/images/{reference}/json")
    return (info.get("Config") or {}).get("Volumes") or {}


def actions(events: list[dict[str, Any]]) -> list[str]:
    """The ``Action`` of each daemon event, in order."""
    return [str(e.get("Action") or e.get("status")) for e in events]


def created_here(events: list[dict[str, Any]]) -> list[str]:
    """The ``Action`` of each event of a container created within ``events``' window. The
    daemon logs a ``start`` once its start call is done, which can be after a kernel path
    run already returned at its payload's exit: an earlier run's late ``start`` is not this
    window's."""
    ids = {e.get("id") for e in events if actions([e]) == ["create"]}
    return actions([e for e in events if e.get("id") in ids])


EXEC_PROBE_TIMEOUT_S = 5.0
"""A witness exec is a short probe; one that does not answer in this long saw nothing."""


def witness_exec(witness: Witness, container_id: str, command: list[str]) -> bytes | None:
    """Run ``command`` in a running container through the witness (TTY: the raw output).

    Under gVisor the payload's processes and files are invisible from the host's /proc, so an
    exec of the witness's own is the independent view of the sandbox. None: not running, or
    the probe did not answer within EXEC_PROBE_TIMEOUT_S.
    """
    created = witness.session.post(
        f"{witness.base}/containers/{container_id}/exec",
        json={"Cmd": command, "AttachStdout": True, "AttachStderr": True, "Tty": True},
        timeout=30,
    )
    if created.status_code in (404, 409):
        return None
    created.raise_for_status()
    try:
        started = witness.session.post(
            f"{witness.base}/exec/{created.json()['Id']}/start",
            json={"Detach": False, "Tty": True},
            timeout=EXEC_PROBE_TIMEOUT_S,
        )
    except requests.exceptions.RequestException:
        # Under gVisor an exec whose container is killed mid-probe can leave its stream open
        # (seen in the full suite): that probe saw nothing, the next one looks again.
        return None
    if started.status_code in (404, 409):
        return None
    if started.status_code == 500 and not _is_running(witness, container_id):
        # Killed between the exec's create and its start (gVisor answers 500, seen in the full
        # suite): that probe saw nothing. A 500 from a running container is still an error.
        return None
    started.raise_for_status()
    return started.content


def _is_running(witness: Witness, container_id: str) -> bool:
    response = witness.session.get(f"{witness.base}/containers/{container_id}/json", timeout=30)
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return bool(response.json().get("State", {}).get("Running"))


def host_processes_of(container_id: str) -> list[int]:
    """Host pids whose command line names the container (its shim; runsc's sandbox, gofer)."""
    needle = container_id.encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def parked_command(command: str) -> bool:
    """The witness's ``Command`` of a container parked for a claim, on either transport: its
    parked shell waits for one claim line (``sbxkit/pool/line.py``). It stays the container's
    listed command after the claim too (a listing never changes): ``still_parked`` tells."""
    return "IFS= read -r l && eval" in command


def still_parked(container_id: str) -> bool:
    """The container's parked shell still waits for its claim line, as the host's /proc shows:
    a process in the container's cgroup whose command line is the parked shell's (a claimed
    container ``exec``ed its payload in its place)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if container_id not in Path(f"/proc/{entry}/cgroup").read_text():
                continue
            if b"IFS= read -r l && eval" in Path(f"/proc/{entry}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def creates_during(witness: Witness, since: float) -> list[dict[str, object]]:
    """Container creates this test run's label saw since ``since``."""
    return witness.events(
        since,
        time.time() + 0.5,
        type=["container"],
        event=["create"],
        label=[f"{RUN_LABEL}={THIS_RUN}"],
    )


class ForwardingOwner:
    """An owner that hands every call to ``inner``: a test's wrapper overrides only the calls
    it watches."""

    def __init__(self, inner: Owner) -> None:
        self._inner = inner

    async def create(self, request: CreateRequest) -> str:
        return await self._inner.create(request)

    async def started(self, lease: str) -> None:
        await self._inner.started(lease)

    def queued_s(self, lease: str) -> float:
        return self._inner.queued_s(lease)

    def created_inspection(self, lease: str) -> ContainerInspect | None:
        return created_inspection(self._inner, lease)

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        return await self._inner.ended_by_owner(lease)

    async def release(self, lease: str) -> bool:
        return await self._inner.release(lease)

    @property
    def fifo_root(self) -> Path:
        return self._inner.fifo_root

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        await self._inner.remove(lease, name, container_id)


def piped(argv: list[str]) -> subprocess.Popen[bytes]:
    """``argv`` started with nothing on its stdin and its stdout and stderr piped (a
    ``python -c`` script: ``[sys.executable, "-c", script]``)."""
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def assert_oom_outcome(result: RunResult, witness: Witness) -> None:
    """An OOM kill is ``oom_killed`` on the daemon's evidence. Where the daemon has none, the
    kill is reported as the exit it is, 137, never as an OOM nobody proved (docs/backends.md):
    Podman 4.3 here never has any (conmon drops its oom marker into the service's working
    directory; its events say only ``died``), and rootless Docker 20.10 on cgroup v2 loses one
    now and then (1 kill in 8 in the cell's VM: no flag, no ``oom`` event, ever). For rootless
    Docker the witness asks the daemon itself, so evidence it had and sbxkit missed fails."""
    if witness.is_podman():
        assert (result.status, result.exit_code, result.oom_evidence) == ("exited", 137, None)
        return
    if result.status == "exited" and witness.is_rootless_docker():
        now = time.time()
        said = witness.events(now - 600, now, container=[result.container_id], event=["oom"])
        assert not said, ("the daemon reported the OOM and sbxkit did not read it", said)
        assert (result.exit_code, result.oom_evidence) == (137, None), result
        return
    assert result.status == "oom_killed", result
    assert result.oom_evidence
    assert result.exit_code is None  # the kernel's kill: no answer of the payload's
