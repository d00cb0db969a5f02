"""A sandbox's rlimits set from the host, for an engine that drops ``HostConfig.Ulimits``.

Rootless Podman (4.3) creates its containers without the ulimits its compat API is asked for.
Its sandboxes' processes are still this host's, so once the container runs and before its
payload does (a one-shot run's shell waits for the gate's line, a parked shell for its claim)
the host sets each limit on every process of the container — the init first, so a child it
forks meanwhile inherits it, then each descendant — with ``prlimit``, reads
``/proc/PID/limits`` back, and lets the payload go only if every process shows exactly what
the plan asked. The payload cannot raise a hard limit again: that takes ``CAP_SYS_RESOURCE``
in the host's user namespace, which nothing in a rootless container holds. The owner of the
container's user namespace (the engine's user) may lower them, and so may root.

Parsing and judging are pure (``parse_limits``, ``limits_problem``); ``enforce_rlimits`` is
the I/O, run in a thread.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable, Mapping

from sbxkit._kernel.pidfd import open_pidfd, still_running
from sbxkit.errors import SpecError

__all__ = [
    "HOST_RLIMITS_CONSUMERS",
    "PROC_LABELS",
    "RESOURCES",
    "RlimitsUnenforced",
    "check_host_rlimits_consumer",
    "enforce_rlimits",
    "limits_problem",
    "parse_limits",
]

RESOURCES: Mapping[str, int] = {
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "msgqueue": resource.RLIMIT_MSGQUEUE,
    "core": resource.RLIMIT_CORE,
    "stack": resource.RLIMIT_STACK,
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "memlock": resource.RLIMIT_MEMLOCK,
}
"""Docker's ulimit names this host can set, by their ``resource`` constant."""
PROC_LABELS: Mapping[str, str] = {
    "fsize": "Max file size",
    "nofile": "Max open files",
    "nproc": "Max processes",
    "msgqueue": "Max msgqueue size",
    "core": "Max core file size",
    "stack": "Max stack size",
    "cpu": "Max cpu time",
    "as": "Max address space",
    "memlock": "Max locked memory",
}
"""How ``/proc/PID/limits`` names each of them."""
UNLIMITED = -1
"""Docker's (and ``resource``'s) spelling of no limit; ``/proc`` says ``unlimited``."""


HOST_RLIMITS_CONSUMERS = ("run",)
"""What rootless Podman serves: a one-shot run (behind its gate) and a pool's parked shell
(before its claim) wait for the host to set their rlimits; the rest start their payload with
the container or through exec, which takes the engine's own limits."""


def check_host_rlimits_consumer(consumer: str) -> None:
    """Refuse, before any container, a sandbox whose rlimits the host would have to set
    (rootless Podman drops ``HostConfig.Ulimits``) for a consumer whose processes do not wait
    for that: a session's and a grant's commands run through exec (the engine's own limits),
    a PTY's and a stdio worker's payload starts with the container."""
    if consumer in HOST_RLIMITS_CONSUMERS:
        return
    raise SpecError(
        "limits",
        f"rootless Podman drops HostConfig.Ulimits, and sbxkit sets them from the host only "
        f"on a one-shot run's or a pool's processes before their payload starts; a {consumer} "
        "sandbox's processes do not wait for that (exec, or a payload that starts with the "
        "container), so they would run without their fsize, msgqueue and nofile limits; use "
        "one-shot runs or a pool on it, or rootless Docker on cgroup v2, a rootful Docker "
        "daemon, or rootful Podman",
    )


class RlimitsUnenforced(Exception):
    """The host could not set or prove a sandbox's rlimits: its payload must not run."""


def parse_limits(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/PID/limits`` as ``{label: (soft, hard)}`` (``unlimited`` is ``UNLIMITED``)."""
    parsed: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[1:]:  # the first line is the header
        words = line.split()
        values = [w for w in words if w.isdigit() or w == "unlimited"]
        if len(values) < 2:
            continue
        label = " ".join(words[: words.index(values[0])])
        soft, hard = (UNLIMITED if v == "unlimited" else int(v) for v in values[:2])
        parsed[label] = (soft, hard)
    return parsed


def limits_problem(
    pid: int, parsed: Mapping[str, tuple[int, int]], wanted: Iterable[tuple[str, int, int]]
) -> str | None:
    """Why process ``pid``'s limits (``parse_limits``) are not exactly ``wanted`` (Docker's
    ulimit names, soft, hard), or None."""
    for name, soft, hard in wanted:
        label = PROC_LABELS.get(name)
        if label is None:
            return f"ulimit {name!r} cannot be set from the host"
        have = parsed.get(label)
        if have != (soft, hard):
            shown = "not shown" if have is None else f"{have[0]}/{have[1]}"
            return f"pid {pid}: {label} is {shown}, expected {soft}/{hard} (soft/hard)"
    return None


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as file:
        return file.read()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found.extend(int(c) for c in _read(f"/proc/{pid}/task/{task}/children").split())
    return found


def enforce_rlimits(pid: int, container_id: str, wanted: Iterable[tuple[str, int, int]]) -> int:
    """Set ``wanted`` on the container's init ``pid`` and every descendant, then prove each
    shows exactly that in ``/proc/PID/limits``; how many processes were set. Each process is
    held as a pidfd and must name the container in its cgroup before it is touched and still
    run after it was read back (no pid was recycled in between: before its payload starts, no
    process of a sandbox exits). ``RlimitsUnenforced`` names what failed."""
    asked = list(wanted)
    unknown = [name for name, _, _ in asked if name not in RESOURCES]
    if unknown:
        raise RlimitsUnenforced(f"ulimits {unknown} cannot be set from the host")
    held: dict[int, int] = {}
    try:
        queue = [pid]
        while queue:
            current = queue.pop(0)
            if current in held:
                continue
            try:
                pidfd = open_pidfd(current)
            except OSError as exc:
                if current == pid:
                    raise RlimitsUnenforced(f"the init pid {pid}: {exc.strerror}") from None
                continue  # a child gone before it ran anything of the payload's
            held[current] = pidfd
            try:
                cgroup = _read(f"/proc/{current}/cgroup")
            except OSError as exc:
                raise RlimitsUnenforced(f"pid {current}: {exc.strerror}") from None
            if container_id not in cgroup:
                raise RlimitsUnenforced(f"pid {current} is not in the container's cgroup")
            for name, soft, hard in asked:
                try:
                    resource.prlimit(current, RESOURCES[name], (soft, hard))
                except OSError as exc:
                    raise RlimitsUnenforced(
                        f"prlimit {name}={soft}:{hard} on pid {current} (uid {os.geteuid()} "
                        f"here): {exc.strerror}"
                    ) from None
            queue.extend(_children(current))  # after its own: a later child inherits them
        for current, pidfd in held.items():
            try:
                text = _read(f"/proc/{current}/limits")
            except OSError as exc:
                raise RlimitsUnenforced(f"pid {current}: {exc.strerror}") from None
            problem = limits_problem(current, parse_limits(text), asked)
            if problem is not None:
                raise RlimitsUnenforced(problem)
            if not still_running(pidfd):
                raise RlimitsUnenforced(f"pid {current} exited before its payload was let go")
        return len(held)
    finally:
        for pidfd in held.values():
            with contextlib.suppress(OSError):
                os.close(pidfd)
