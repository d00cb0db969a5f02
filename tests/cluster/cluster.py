"""A real Ray cluster on this machine for the cluster tier: a head and two worker nodes.

Everything runs inside a network namespace the tests create with only loopback in it (no
route out, checked before anything starts), and every node binds 127.0.0.1
(tests/cluster/raynode.py): whatever Ray tries, nothing leaves the machine, and its ports
collide with nobody's. Each worker node is bound to its own private Docker daemon through its
environment (``DOCKER_HOST``) and keeps its own supervisor state dir, so placement is
observable per daemon. Unix sockets are files: the daemons outside the namespace are reachable
from inside it.

The cluster runs as docs/cluster.md says a cluster must: every node and the driver with Ray's
token authentication (``RAY_AUTH_MODE=token``, the token in a 0600 file named by
``RAY_AUTH_TOKEN_PATH``), and the sbxkit nodes and the driver with the cluster secret (a 0600
file named by ``SBXKIT_CLUSTER_SECRET_FILE``). ``LocalCluster(..., auth=False)`` starts one the
way the old docs did, without either, to show what that let in.

What Ray would otherwise do on the network, and what stops it here (docs/cluster.md):
``RAY_USAGE_STATS_ENABLED=0`` and ``--include-dashboard=false`` leave a minimal API server on
the head that still reports "usage stats disabled" to Ray's server
(``RAY_USAGE_STATS_REPORT_URL`` points it at a closed loopback port) and probes cloud metadata
services unless ``~/ray_bootstrap_config.yaml`` exists (the head gets a HOME with one).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAD_PORT = 6379
ADDRESS = f"127.0.0.1:{HEAD_PORT}"
NODE_RESOURCES = {"sbxkit_sandboxes": 4, "sbxkit_memory_mib": 4096}
NODE_CPUS = 4  # a relay holds one while its job runs: at most 4 jobs (and relays) a node
START_TIMEOUT_S = 120.0

RAY_QUIET = {
    # Keeps every address Ray computes on loopback (no outward-address lookup).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    "PYTHONUNBUFFERED": "1",
}


class Node:
    def __init__(self, name: str, process: subprocess.Popen[bytes], info: Path) -> None:
        self.name = name
        self.process = process
        self.info_path = info

    def info(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads(self.info_path.read_text())
        return loaded

    @property
    def node_id(self) -> str:
        return str(self.info()["node_id"])

    @property
    def raylet_pid(self) -> int:
        pids = self.info()["pids"]
        assert isinstance(pids, dict)
        return int(pids["raylet"][0])


def write_private(path: Path, text: str) -> Path:
    """``text`` in a new file only its owner can read (0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    return path


class LocalCluster:
    """``start()`` the namespace, the head and the worker nodes; ``stop()`` all of it."""

    def __init__(
        self, root: Path, sockets: dict[str, str], *, auth: bool = True, tag: str = "ray"
    ) -> None:
        self.root = root
        self.sockets = sockets
        self.auth = auth
        self.netns = f"sbxkit-{tag}-{os.getpid()}"
        self.nodes: dict[str, Node] = {}
        self.home = root / "home"
        self.token_path = root / "ray-token"
        self.secret_path = root / "cluster-secret"

    def auth_env(self) -> dict[str, str]:
        """What every node and the driver get: Ray's token and the cluster secret (or, for
        ``auth=False``, token authentication off, as Ray's default was)."""
        if not self.auth:
            return {"RAY_AUTH_MODE": "disabled"}
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "SBXKIT_CLUSTER_SECRET_FILE": str(self.secret_path),
        }

    # -- namespace ------------------------------------------------------------------------------

    def _ip(self, *args: str) -> str:
        return subprocess.run(
            ["ip", *args], check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def in_ns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def start(self) -> None:
        self._ip("netns", "add", self.netns)
        self._ip("netns", "exec", self.netns, "ip", "link", "set", "lo", "up")
        routes = self._ip("netns", "exec", self.netns, "ip", "route", "show")
        links = self._ip("netns", "exec", self.netns, "ip", "-o", "link", "show")
        assert routes.strip() == "", f"the namespace has a route: {routes}"
        assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links
        self.home.mkdir(parents=True)
        (self.home / "ray_bootstrap_config.yaml").write_text("{}\n")
        if self.auth:
            write_private(self.token_path, secrets.token_hex(32))
            write_private(self.secret_path, secrets.token_hex(32))
        self.nodes["head"] = self._launch("head", ["--head", "--port", str(HEAD_PORT)], {})
        self._wait(self.nodes["head"])
        for name in self.sockets:
            self.start_node(name, wait=False)
        for name in self.sockets:
            self._wait(self.nodes[name])

    def start_node(
        self,
        name: str,
        *,
        wait: bool = True,
        socket: str | None = None,
        env: dict[str, str] | None = None,
        resources: dict[str, int] | None = None,
        cpus: int = NODE_CPUS,
    ) -> Node:
        """(Re)start worker node ``name``: its daemon (``socket``, default its own) through
        DOCKER_HOST, its own supervisor state dir, sbxkit resources; ``env`` on top."""
        socket = socket if socket is not None else self.sockets[name]
        node_env = {
            "DOCKER_HOST": f"unix://{socket}",
            "SBXKIT_STATE_DIR": str(self.root / f"state-{name}"),
            **(env or {}),
        }
        argv = [
            "--address",
            ADDRESS,
            "--resources",
            json.dumps(NODE_RESOURCES if resources is None else resources),
            "--num-cpus",
            str(cpus),
        ]
        node = self._launch(name, argv, node_env)
        self.nodes[name] = node
        if wait:
            self._wait(node)
        return node

    def _launch(self, name: str, argv: list[str], env: dict[str, str]) -> Node:
        info = self.root / f"{name}-{time.monotonic_ns()}.json"
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        process = subprocess.Popen(
            self.in_ns(
                [
                    sys.executable,
                    "-m",
                    "tests.cluster.raynode",
                    "--name",
                    name,
                    "--temp-dir",
                    str(self.root / f"ray-{name}"),
                    "--info",
                    str(info),
                    *argv,
                ]
            ),
            cwd=REPO,
            env={**_outer_env(), **RAY_QUIET, "HOME": str(self.home), **self.auth_env(), **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return Node(name, process, info)

    def _wait(self, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not node.info_path.exists():
            if node.process.poll() is not None or time.monotonic() > deadline:
                log = (self.root / f"{node.name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Ray node {node.name} did not start:\n{log}")
            time.sleep(0.2)

    # -- faults ---------------------------------------------------------------------------------

    def kill_raylet(self, name: str) -> int:
        """SIGKILL node ``name``'s raylet (the node is lost; its launcher reaps it)."""
        pid = self.nodes[name].raylet_pid
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_node(self, name: str, also: Sequence[int] = ()) -> None:
        """SIGKILL node ``name``'s whole process group (the launcher, raylet and agents of
        Ray's) and the pids ``also`` (``freeze_node``'s): the host is gone, as far as Ray can
        tell."""
        node = self.nodes.pop(name)
        for pid in also:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=30)

    def freeze_node(self, name: str) -> list[int]:
        """SIGSTOP every process of node ``name`` — its process group and every descendant of
        its launcher, Ray's workers (the sbxkit agent among them) included, whatever session
        they made — until none is left unfrozen: none of them acts again (a host that lost its
        power). ``kill_node`` then ends them for Ray too. The frozen pids."""
        launcher = self.nodes[name].process.pid
        os.killpg(launcher, signal.SIGSTOP)
        frozen: set[int] = set()
        while fresh := _descendants(launcher) - frozen:  # one that forked before it stopped
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            frozen |= fresh
        return sorted(frozen)

    def stop_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        _stop(node.process)

    # -- checks ---------------------------------------------------------------------------------

    def listeners(self) -> list[str]:
        """Every listening TCP socket in the namespace: ``address:port process``."""
        out = self._ip("netns", "exec", self.netns, "ss", "-ltnpH")
        return [" ".join(line.split()[3:4] + line.split()[5:6]) for line in out.splitlines()]

    def pids(self) -> list[int]:
        return [int(p) for p in self._ip("netns", "pids", self.netns).split()]

    def strays(self) -> dict[int, str]:
        """Processes in the namespace that belong to no running node (a node's launcher and
        its descendants: Ray's processes and workers) and are no node's supervisor (which
        outlives its node by design): what a test left behind. pid → command line."""
        kept: set[int] = set()
        for node in self.nodes.values():
            if node.process.poll() is None:
                kept |= {node.process.pid} | _descendants(node.process.pid)
        found = {}
        for pid in set(self.pids()) - kept:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if b"sbxkit.supervisor" in argv and any(
                a.startswith(str(self.root).encode()) for a in argv
            ):
                continue
            found[pid] = b" ".join(argv).decode(errors="replace").strip()
        return found

    def listeners_of(self, pids: set[int]) -> list[str]:
        """The namespace's listening sockets held by any of ``pids``."""
        return [entry for entry in self.listeners() if any(f"pid={pid}," in entry for pid in pids)]

    def driver_env(self) -> dict[str, str]:
        return {**_outer_env(), **RAY_QUIET, **self.auth_env()}

    # -- teardown -------------------------------------------------------------------------------

    def stop(self) -> None:
        for node in self.nodes.values():
            _stop(node.process)
        self.nodes.clear()
        deadline = time.monotonic() + 30
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:  # workers and supervisors started inside our namespace
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 20 else 9)
            time.sleep(0.5)
        self._ip("netns", "del", self.netns)


def _outer_env() -> dict[str, str]:
    """This process's environment less any Ray credential or cluster secret of its own."""
    own = ("RAY_AUTH_", "SBXKIT_CLUSTER_SECRET", "RAY_ADDRESS")
    return {k: v for k, v in os.environ.items() if not k.startswith(own)}


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # whatever the node left in its group
        os.killpg(process.pid, signal.SIGKILL)


def _descendants(root: int) -> set[int]:
    """Every live process descending from ``root`` (by /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def ray_workers(socket_path: str) -> set[int]:
    """The Ray worker processes (``ray::…``: relays, agents, idle ones) of the node bound to
    ``socket_path`` (its workers inherit the node's DOCKER_HOST)."""
    wanted = f"DOCKER_HOST=unix://{socket_path}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(b"ray::"):
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found
