"""What ``bench concurrent_cli`` runs: ``sbxkit run`` and ``docker run --rm`` as processes, the
way a shell (or an agent's tool call) starts them, each output checked.

``sbxkit`` is the installed console script beside this interpreter (``python -m sbxkit`` when
there is none), talking to a supervisor this benchmark starts on a private state directory:
every ``sbxkit run`` hands its run to it (sbxkit/handoff), and the benchmark fails if one did
not (``SBXKIT_HANDOFF_TRACE``). ``docker`` is the docker CLI pointed at the same daemon. Same
image, same bounds (cpus 1, memory 64m, pids 64, no network).

A run ``sbxkit run`` returned at the payload's exit leaves its container's removal (and, for a
pooled run, the pool's refill) to the supervisor: ``settle`` waits for both, untimed, before the
next contender, so one contender's background work never loads the daemon under another's
measured run.
"""

from __future__ import annotations

import compileall
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from bench.harness import SBXKIT_SOURCE, Contender, StepTimings
from bench.pool import Settling, supervisor_pools_full
from bench.rawapi import RawEngine
from bench.suite import BENCH_LABEL
from sbxkit._lifecycle.launch_environment import supervisor_environment
from sbxkit._lifecycle.leases_admin import pools_request
from sbxkit._protocol.wire import EndPools

CPUS, MEMORY, PIDS = "1", "64m", "64"
POOL_SIZE = 2


def sbxkit_command() -> list[str]:
    """The ``sbxkit`` a shell would start: the console script beside this interpreter."""
    script = Path(sys.executable).parent / "sbxkit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "sbxkit"]


class CliBench:
    """A private state directory with a supervisor of its own, the commands, and the settling
    between contenders."""

    def __init__(self, socket: str, image: str, bench: str) -> None:
        self.socket, self.image, self.bench = socket, image, bench
        self.root = Path(tempfile.mkdtemp(prefix="sbxcli-", dir="/tmp"))
        os.chmod(self.root, 0o700)
        self.state_dir = self.root / "leases"
        self.trace = self.root / "handoff.trace"
        self.env = {
            **os.environ,
            "SBXKIT_STATE_DIR": str(self.state_dir),
            "SBXKIT_HANDOFF_TRACE": str(self.trace),
            "DOCKER_HOST": f"unix://{socket}",
        }
        self.witness = RawEngine(socket)
        self.settling = Settling(self.witness)
        self.supervisor: subprocess.Popen[bytes] | None = None
        docker = shutil.which("docker")
        if docker is None:
            raise SystemExit(f"bench {bench}: no `docker` on PATH (the docker run baseline)")
        self.docker = docker

    # -- the supervisor ---------------------------------------------------------------------

    @staticmethod
    def compile_bytecode() -> None:
        """Write sbxkit's bytecode now, untimed: an installed package has it (pip compiles at
        install), and a process started with PYTHONDONTWRITEBYTECODE would otherwise compile
        every module it loads, every time."""
        compileall.compile_dir(str(SBXKIT_SOURCE), quiet=1)

    def start_supervisor(self) -> None:
        """``sbxkit.supervisor --persistent`` on the private state directory, with the
        environment an auto-launched one gets."""
        log = open(self.root / "supervisor.log", "ab")  # noqa: SIM115 - the child keeps it
        self.supervisor = subprocess.Popen(
            [
                *(sys.executable, "-m", "sbxkit.supervisor", "--state-dir", str(self.state_dir)),
                *("--persistent", "--engine-socket", self.socket),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=supervisor_environment(os.environb),
        )
        log.close()
        deadline = time.monotonic() + 30
        while not (self.state_dir / "supervisor.sock").exists():
            if self.supervisor.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench {self.bench}: the supervisor did not start: {self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return (self.root / "supervisor.log").read_text(errors="replace")

    async def stop(self) -> None:
        """End the pools (their parked containers removed), stop the supervisor, remove the
        state directory."""
        if self.supervisor is not None and self.supervisor.poll() is None:
            await pools_request(self.state_dir, EndPools())
            self.supervisor.terminate()
            await trio.to_thread.run_sync(self.supervisor.wait, 30)
        self.witness.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def paths_taken(self) -> dict[str, int]:
        """How each ``sbxkit`` process ran: ``handed off``, or the full path and why."""
        if not self.trace.exists():
            return {}
        return dict(Counter(self.trace.read_text().splitlines()))

    # -- the commands -----------------------------------------------------------------------

    def label(self, contender: str) -> list[str]:
        return ["--label", f"{BENCH_LABEL}={self.bench}:{contender}"]

    def sbxkit_run(self, contender: str, *, pool: bool) -> list[str]:
        flags = ["--json", "--stdin", "none", "--socket", self.socket, "--cpus", CPUS]
        flags += ["--memory", MEMORY, "--pids", PIDS, "--timeout", "30"]
        if pool:
            flags += ["--pool", str(POOL_SIZE)]
        return [*sbxkit_command(), "run", *flags, *self.label(contender), self.image, "--"]

    def docker_run(self, contender: str) -> list[str]:
        flags = ["--network", "none", "--cpus", CPUS, "--memory", MEMORY, "--pids-limit", PIDS]
        return [self.docker, "run", "--rm", *flags, *self.label(contender), self.image]

    async def _echo(self, argv: list[str]) -> tuple[subprocess.CompletedProcess[bytes], str]:
        """``argv echo MARKER`` as a process, and the marker."""
        marker = secrets.token_hex(8)
        done = await trio.run_process(
            [*argv, "echo", marker],
            capture_stdout=True,
            capture_stderr=True,
            env=self.env,
            check=False,
        )
        return done, marker

    async def sbxkit_once(self, argv: list[str], *, pooled: bool) -> None:
        """One ``sbxkit run … echo MARKER``: exit 0, the marker back, claimed when ``pooled``."""
        done, marker = await self._echo(argv)
        if done.returncode != 0:
            raise RuntimeError(f"sbxkit run exited {done.returncode}: {done.stderr!r}")
        doc: dict[str, Any] = json.loads(done.stdout)
        if doc["stdout"] != marker + "\n" or doc["pooled"] != pooled:
            raise RuntimeError(f"sbxkit run: wrong output or path: {doc}")
        self.settling.pending.add(doc["container_id"])

    async def docker_once(self, argv: list[str]) -> None:
        done, marker = await self._echo(argv)
        if done.returncode != 0 or done.stdout != (marker + "\n").encode():
            raise RuntimeError(f"docker run exited {done.returncode}: {done.stderr!r}")

    # -- settling ---------------------------------------------------------------------------

    async def settle(self) -> None:
        """Untimed: the containers sbxkit left to its supervisor are gone, and every held
        pool has its parked containers back."""
        await self.settling.settle()
        with trio.fail_after(60):
            await supervisor_pools_full(self.state_dir)

    # -- the contenders of the sequential phase ---------------------------------------------

    def contenders(self) -> list[Contender]:
        pool_argv = self.sbxkit_run("sbxkit_pool", pool=True)
        cold_argv = self.sbxkit_run("sbxkit_cold", pool=False)
        docker_argv = self.docker_run("docker_run")

        async def pooled() -> StepTimings:
            await self.sbxkit_once(pool_argv, pooled=True)
            return {}

        async def cold() -> StepTimings:
            await self.sbxkit_once(cold_argv, pooled=False)
            return {}

        async def docker() -> StepTimings:
            await self.docker_once(docker_argv)
            return {}

        def shown(argv: list[str]) -> str:
            return "subprocess: " + " ".join([Path(argv[0]).name, *argv[1:]]) + " echo MARKER"

        return [
            Contender("sbxkit_pool", "sbxkit run --pool 2", shown(pool_argv), pooled, self.settle),
            Contender("sbxkit_cold", "sbxkit run", shown(cold_argv), cold, self.settle),
            Contender("docker_run", "docker run --rm", shown(docker_argv), docker, self.settle),
        ]
