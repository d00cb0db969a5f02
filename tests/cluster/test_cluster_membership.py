"""How nodes come and go during a batch: a join lost to a transient failure is tried again, a
frozen node does not hold the batch's start, and work beyond the nodes' room is Ray's resource
demand (what an autoscaler adds nodes for)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.cluster.cluster import ADDRESS, REPO, LocalCluster
from tests.cluster.test_cluster_batch import (
    BATCH_TIMEOUT_S,
    SLOTS,
    _agent_of,
    _supervisors_of,
    interrupt,
    lines,
    run_batch,
    running,
    start_batch,
    wait_for,
    write_jobs,
)
from tests.witness import PYTHON, Witness


class HeldEngine:
    """A Unix socket in front of a Docker daemon that holds every connection while ``held``
    (nothing reaches the daemon, nothing comes back), then passes bytes both ways: a slow
    engine, injected in front of the real one."""

    def __init__(self, daemon: str, path: Path) -> None:
        self.daemon = daemon
        self.path = str(path)
        self.released = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(64)
        self._open: list[socket.socket] = []
        self._stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._open.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.released.wait()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.daemon)
        except OSError:
            client.close()
            return
        self._open.append(upstream)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)

    def stop(self) -> None:
        self._stopping = True
        self.released.set()
        self._server.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@contextlib.contextmanager
def node_behind_held_engine(
    cluster: LocalCluster, name: str, daemon: str, root: Path
) -> Iterator[HeldEngine]:
    """Node ``name`` restarted on ``daemon`` through a ``HeldEngine`` (held), with a state
    dir of its own; afterwards back on its daemon, its supervisor of that state dir ended."""
    held = HeldEngine(daemon, root / "held.sock")
    state = root / "state-held"
    cluster.stop_node(name)
    cluster.start_node(name, socket=held.path, env={"SBXKIT_STATE_DIR": str(state)})
    try:
        yield held
    finally:
        held.released.set()
        cluster.stop_node(name)
        for pid in _supervisors_of(state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _supervisors_of(state), 30, "the held node's supervisor gone")
        held.stop()
        cluster.start_node(name)


def test_a_join_lost_to_a_transient_failure_is_tried_again(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """rayb's agent dies in the middle of its join (its engine is slow to answer, its worker
    killed meanwhile: what Ray reports as the actor died or is temporarily unavailable) while
    rayb stays alive: a new agent joins, and rayb runs jobs of the batch. Before, rayb was
    refused ("its agent could not start") for the rest of the batch."""
    rayb = node_witnesses["rayb"]
    with node_behind_held_engine(cluster, "rayb", rayb.socket_path, tmp_path) as held:
        jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
        write_jobs(jobs, 16, "sleep 4; echo done")
        driver = start_batch(cluster, jobs, out)
        try:
            wait_for(lambda: _agent_of(held.path) is not None, 120, "rayb's first agent")
            first = _agent_of(held.path)
            assert first is not None
            time.sleep(1)  # its join is under way, held at the engine
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: _agent_of(held.path) not in (None, first), 60, "a second agent")
            held.released.set()
            _, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
        finally:
            interrupt(driver)
        assert driver.returncode == 0, stderr
        assert "node rayb (" not in stderr, stderr  # not refused
        final = [r for r in lines(out) if r["status"] != "lost"]
        assert sorted(r["id"] for r in final) == sorted(f"j{i}" for i in range(16))
        placed = Counter(r["node"] for r in final)
        assert placed["rayb"] > 0, placed


def test_a_frozen_node_does_not_hold_the_batch(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """rayb stops answering (every process of it frozen) but Ray still lists it alive: the
    batch starts on raya once raya has joined, instead of waiting out rayb's join (before:
    the join timeout, 120 s)."""
    frozen = cluster.freeze_node("rayb")
    try:
        jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
        write_jobs(jobs, 4, "echo done")
        began = time.monotonic()
        done = run_batch(cluster, jobs, out)
        took = time.monotonic() - began
    finally:
        cluster.kill_node("rayb", also=frozen)
    assert done.returncode == 0, done.stderr
    results = lines(out)
    assert [r["node"] for r in results] == ["raya"] * 4
    assert all(r["stdout"] == "done\n" for r in results), results
    assert took < 45, f"the batch took {took:.1f} s"
    cluster.start_node("rayb")


DEMAND = """
import json, sys, time
from ray.autoscaler.v2.sdk import get_cluster_status

most, shapes = 0, []
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline and most < int(sys.argv[3]):
    status = get_cluster_status(sys.argv[1])
    found = [
        (dict(shape.bundle), shape.count)
        for demand in status.resource_demands.ray_task_actor_demand
        for shape in demand.bundles_by_count
        if shape.bundle.get("sbxkit_sandboxes")
    ]
    if sum(count for _, count in found) > most:
        most, shapes = sum(count for _, count in found), found
    time.sleep(0.5)
print(json.dumps({"most": most, "shapes": shapes}))
"""


def test_work_beyond_the_nodes_room_is_rays_resource_demand(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """A batch restricted to raya (4 sandboxes) with 12 jobs: raya runs 4, and the relays of
    the next 4 wait in Ray against the sbxkit resources — Ray's autoscaler view reports them
    as pending demand (before, the driver held them back and Ray saw no demand)."""
    script = f"""
import json, trio, sbxkit
spec = sbxkit.SandboxSpec(image={PYTHON!r}, command=["sh", "-c", "sleep 8; echo done"],
    limits=sbxkit.Limits(cpus=0.25, memory_bytes=64 * sbxkit.MiB, pids=32,
                         output_bytes=sbxkit.MiB, timeout_s=120))
jobs = [sbxkit.Job(id=i, spec=spec) for i in range(12)]
async def main():
    return await sbxkit.run_many(jobs, parallel=64, cluster=sbxkit.RayCluster({ADDRESS!r},
                                 nodes=["raya"]))
results = trio.run(main)
print(json.dumps([[r.id, r.node, r.result.stdout.decode()] for r in results]))
"""
    driver = subprocess.Popen(
        cluster.in_ns([sys.executable, "-c", script]),
        cwd=REPO,
        env=cluster.driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: running(node_witnesses["raya"]) == SLOTS, 120, "raya full")
        seen = subprocess.run(
            cluster.in_ns([sys.executable, "-c", DEMAND, ADDRESS, "30", str(SLOTS)]),
            cwd=REPO,
            env=cluster.driver_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        stdout, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
    finally:
        interrupt(driver)
    assert seen.returncode == 0, seen.stderr[-2000:]
    demand = json.loads(seen.stdout.strip().splitlines()[-1])
    # Relays waiting in Ray for room on raya: at most as many again as raya holds (Ray's
    # report is a sample: some may be on their way to a worker when it is taken).
    assert 1 <= demand["most"] <= SLOTS, demand
    # One sandbox, its memory, and the CPU the relay holds while its job runs.
    wanted = {"CPU": 1.0, "sbxkit_sandboxes": 1.0, "sbxkit_memory_mib": 64.0}
    assert all(bundle == wanted for bundle, _ in demand["shapes"]), demand
    assert driver.returncode == 0, stderr
    results = json.loads(stdout.strip().splitlines()[-1])
    assert [r[0] for r in results] == list(range(12))
    assert all(r[1] == "raya" and r[2] == "done\n" for r in results), results
