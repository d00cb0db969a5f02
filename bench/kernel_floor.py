"""``raw_kernel``: the kernel path's daemon and kernel work without sbxkit — what a cold kernel
path run would take if sbxkit's client and supervisor took no time at all.

Prepared untimed: sbxkit's own kernel path create body (``policy.build_create_body``, then
``kernel.scripts.kernel_io``: stdio on FIFOs in a private host directory made by
``kernel.fifos.make_io_dir``, the shell waiting for its go line) and the host's FIFO ends.
Timed, through the raw client on one keep-alive connection in a worker thread:

- create;
- start, until the shell's byte on the stderr FIFO says it runs (the start's answer is read
  later: the product does not wait for it either once it knows where the daemon puts its
  containers' cgroups);
- the init found in its cgroup's process list (``kernel.initpid``; the first run, a warm-up
  one, learns where from ``State.Pid``) and opened as a pidfd, the go line written, and the
  init's exit status read from the pidfd (``kernel.pidfd``) — the product's own end of a run.

Then, untimed (before the next contender runs): the start's answer, the daemon's ``wait``, the
DELETE and the FIFO directory's removal. Left out is everything sbxkit's client and supervisor
do: the supervisor's round trips and journal, the checks of the container against its plan,
the init's verification and its OOM watch. ``cold − raw_kernel`` is what they add.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench.harness import StepTimings
from bench.rawapi import RawEngine
from sbxkit._kernel.fifos import make_io_dir, open_host_ends, remove_io_dir, sandbox_ids
from sbxkit._kernel.init import memory_cgroup_of
from sbxkit._kernel.initpid import init_pid_on_host, learn_cgroup_layout
from sbxkit._kernel.pidfd import exit_status, status_code, wait_reaped, zombie_status
from sbxkit._kernel.scripts import GO_LINE, kernel_io
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.policy import build_create_body
from sbxkit._util.readiness import readable

PREFIX = "sbxbench-raw-kernel-"
LIMIT_S = 30.0
"""The longest the shell may take to say it runs, and the payload to end."""


def kernel_floor_body(spec: SandboxSpec, lease: str, io_dir: Path) -> dict[str, Any]:
    """sbxkit's kernel path create body for ``spec`` with its FIFOs in ``io_dir``, labelled
    with ``spec.labels`` alone (no lease label: no supervisor owns it). The shell's script is
    built with no image environment, as the product builds it for an image that sets none of
    the shell's own keys (busybox's sets only ``PATH``)."""
    body, _ = kernel_io(build_create_body(spec, lease), str(io_dir), {})
    data: dict[str, Any] = msgspec.to_builtins(body)
    data["Labels"] = dict(spec.labels)
    return data


class KernelFloorRun:
    """One ``raw_kernel`` run: made ready (blocking, untimed), ``timed`` (blocking; a payload
    that did not exit 0 fails it), then ``finish`` (blocking, untimed; also after a failure:
    it removes whatever was made, waiting for the daemon's exit path only after a run)."""

    def __init__(self, api: RawEngine, spec: SandboxSpec, root: Path) -> None:
        self.api, self.root = api, root
        self.lease = secrets.token_hex(16)
        self.name = PREFIX + self.lease[:16]
        self.container_id: str | None = None
        self.pidfd: int | None = None
        self.exit_code: int | None = None
        body = kernel_floor_body(spec, self.lease, root / self.lease)
        self.body = json.dumps(body).encode()
        leaf = make_io_dir(root, self.lease, *sandbox_ids(body["User"]))
        try:
            self.ends = open_host_ends(leaf)
        except BaseException:
            remove_io_dir(root, self.lease)
            raise

    def timed(self) -> StepTimings:
        api, clock = self.api, time.perf_counter
        t0 = clock()
        _, reply = api.call("POST", f"/containers/create?name={self.name}", self.body, ok=(201,))
        self.container_id = container_id = str(json.loads(reply)["Id"])
        t1 = clock()
        api.begin("POST", f"/containers/{container_id}/start")
        _read_until(self.ends.stderr, lambda seen: b"R" in seen, "the shell's byte")
        t2 = clock()
        pid = self._init_pid(container_id)
        self.pidfd = os.pidfd_open(pid)
        os.write(self.ends.stdin, GO_LINE)
        self.exit_code = status_code(_exit_status(pid, self.pidfd))
        t3 = clock()
        if self.exit_code != 0:
            raise RuntimeError(f"raw_kernel: {self.name} exited {self.exit_code}")
        return {"create": t1 - t0, "start": t2 - t1, "run": t3 - t2}

    def _init_pid(self, container_id: str) -> int:
        socket_path = self.api.socket_path
        pid = init_pid_on_host(socket_path, container_id)
        if pid is not None:
            return pid
        # Where this daemon puts its containers' cgroups is not known yet (a warm-up run).
        self.api.finish(ok=(204,))  # State.Pid is the daemon's once it answered the start
        pid = int(self.api.get_json(f"/containers/{container_id}/json")["State"]["Pid"])
        with open(f"/proc/{pid}/cgroup", encoding="ascii") as file:
            found = memory_cgroup_of(file.read())
        learn_cgroup_layout(socket_path, found[0] if found else None, container_id)
        return pid

    def finish(self) -> None:
        api = self.api
        try:
            self.ends.close()
            if self.pidfd is not None:
                os.close(self.pidfd)
            if self.exit_code is not None:  # it ran: its exit path done before the next run
                if api.begun:
                    api.finish(ok=(204,))
                api.call("POST", f"/containers/{self.container_id}/wait", ok=(200,))
        finally:
            api.reset()  # a start whose answer was never read leaves the connection unusable
            api.remove(self.container_id or self.name)
            remove_io_dir(self.root, self.lease)


def _exit_status(pid: int, pidfd: int) -> int:
    """The init's wait status once it exited: its zombie's record, or the reap's."""
    if not readable([pidfd], LIMIT_S):
        raise RuntimeError(f"raw_kernel: the payload did not end within {LIMIT_S:g} s")
    status = exit_status(pidfd)
    if status is None:
        status = zombie_status(pid, pidfd)
    if status is None:
        wait_reaped(pidfd, LIMIT_S)
        status = exit_status(pidfd)
    if status is None:
        raise RuntimeError("raw_kernel: the init was never reaped")
    return status


def _read_until(fd: int, done: Callable[[bytes], bool], what: str) -> bytes:
    seen = b""
    deadline = time.monotonic() + LIMIT_S
    while not done(seen):
        if not readable([fd], max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"raw_kernel: no {what} within {LIMIT_S:g} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError(f"raw_kernel: the FIFO closed before {what}")
        seen += chunk
    return seen
