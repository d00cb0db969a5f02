"""Batches across a real Ray cluster: placement over both nodes, a node lost mid-batch, the
driver's Ctrl-C, nodes refused when they join — each node's daemon witnessed on its own.

Every driver runs as its own process inside the cluster's namespace (``sbxkit batch --ray``, or
a script calling ``run_many(cluster=...)``), as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sbxkit._protocol.statedir import LOCK_NAME
from tests.cluster.cluster import (
    ADDRESS,
    NODE_CPUS,
    NODE_RESOURCES,
    REPO,
    LocalCluster,
    ray_workers,
)
from tests.witness import PYTHON, RUN_LABEL, THIS_RUN, Witness

LIMITS = {"cpus": 0.25, "memory": "64m", "pids": 32, "max_output": "1m", "timeout": 120}
BATCH_TIMEOUT_S = 240
SLOTS = int(NODE_RESOURCES["sbxkit_sandboxes"])


def write_jobs(path: Path, count: int, command: str, image: str = PYTHON) -> None:
    lines = [
        {"id": f"j{i}", "image": image, "command": ["sh", "-c", command], "limits": LIMITS}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def batch_argv(cluster: LocalCluster, jobs: Path, out: Path, *flags: str) -> list[str]:
    return cluster.in_ns(
        [
            *(sys.executable, "-m", "sbxkit", "batch", str(jobs), "--out", str(out)),
            *("--ray", ADDRESS, "--no-progress", *flags),
        ]
    )


def run_batch(
    cluster: LocalCluster, jobs: Path, out: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        batch_argv(cluster, jobs, out, *flags),
        cwd=REPO,
        env=cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=BATCH_TIMEOUT_S,
    )


def lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def ended_once_each(
    out: Path, count: int, *, lost_on: str, lost_count: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every job has exactly one final line (exited, ``done``); ``lost_count`` attempts were
    lost on node ``lost_on`` (attempt 1) and their jobs ended with attempt 2. Returns the lost
    lines and the final lines of their jobs."""
    results = lines(out)
    final = [r for r in results if r["status"] != "lost"]
    lost = [r for r in results if r["status"] == "lost"]
    assert sorted(r["id"] for r in final) == sorted(f"j{i}" for i in range(count))
    assert all(r["status"] == "exited" and r["stdout"] == "done\n" for r in final), final
    assert len(lost) == lost_count, (lost, lost_count)  # every attempt the node was running
    assert all(r["node"] == lost_on and r["attempt"] == 1 for r in lost), lost
    assert all(r["error"]["type"] == "NodeLost" for r in lost), lost
    lost_ids = {r["id"] for r in lost}
    retried = [r for r in final if r["id"] in lost_ids]
    assert all(r["attempt"] == 2 for r in retried), retried
    return lost, retried


def running(witness: Witness) -> int:
    return sum(1 for c in witness.sbxkit_containers() if c.get("State") == "running")


def wait_for(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def creates(witness: Witness, since: float) -> int:
    """Containers of this test run created on the daemon since ``since`` (its own events)."""
    events = witness.events(
        since, time.time(), type=["container"], event=["create"], label=[f"{RUN_LABEL}={THIS_RUN}"]
    )
    return len(events)


# --- tests ---------------------------------------------------------------------------------------


def test_ray_listens_on_loopback_only(cluster: LocalCluster) -> None:
    listeners = cluster.listeners()
    assert any(":6379 " in f"{entry} " for entry in listeners), listeners  # the test can fail
    outside = [
        entry
        for entry in listeners
        if entry.split()[0].rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:") != "127.0.0.1"
    ]
    assert outside == [], f"listening beyond loopback: {outside}"


def test_a_batch_spreads_over_both_nodes_and_resumes(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    write_jobs(jobs, 12, 'sleep 1; echo "ran $HOSTNAME"')
    since = time.time()
    done = run_batch(cluster, jobs, out)
    assert done.returncode == 0, done.stderr
    results = lines(out)
    assert sorted(r["id"] for r in results) == sorted(f"j{i}" for i in range(12))
    assert all(r["status"] == "exited" and r["exit_code"] == 0 for r in results), results
    assert all(r["stdout"].startswith("ran ") and r["attempt"] == 1 for r in results)
    placed = Counter(r["node"] for r in results)
    assert set(placed) == {"raya", "rayb"}, placed
    # Each daemon saw exactly the containers the results place on it.
    assert {name: creates(w, since) for name, w in node_witnesses.items()} == dict(placed)

    before = out.read_bytes()
    again = run_batch(cluster, jobs, out)
    assert again.returncode == 0, again.stderr
    assert "nothing to do: all 12 jobs have a line" in again.stderr
    assert out.read_bytes() == before


def test_run_many_with_a_cluster(cluster: LocalCluster) -> None:
    script = f"""
import json, trio, sbxkit
spec = sbxkit.SandboxSpec(image={PYTHON!r}, command=["cat"], limits=sbxkit.Limits(
    cpus=0.25, memory_bytes=64 * sbxkit.MiB, pids=32, output_bytes=sbxkit.MiB, timeout_s=60))
jobs = [sbxkit.Job(id=i, spec=spec, stdin=f"payload {{i}}".encode()) for i in range(4)]
heard = []
async def main():
    return await sbxkit.run_many(
        jobs, parallel=8, cluster=sbxkit.RayCluster({ADDRESS!r}, nodes=["rayb"]),
        on_result=heard.append)
results = trio.run(main)
print(json.dumps([[r.id, r.node, r.result.stdout.decode(), r.lost] for r in results]
                 + [len(heard)]))
"""
    done = subprocess.run(
        cluster.in_ns([sys.executable, "-c", script]),
        cwd=REPO,
        env=cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=BATCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    *results, heard = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r[0] for r in results] == [0, 1, 2, 3]  # input order
    assert [r[2] for r in results] == [f"payload {i}" for i in range(4)]  # output through Ray
    assert all(r[1] == "rayb" and r[3] is False for r in results)  # nodes=["rayb"] only
    assert heard == 4


def test_a_node_lost_mid_batch_ends_every_job_once(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    write_jobs(jobs, 8, "sleep 12; echo done")
    driver = start_batch(cluster, jobs, out)
    try:
        rayb = node_witnesses["rayb"]
        wait_for(lambda: running(rayb) == SLOTS, 120, "rayb full")  # 8 jobs, 4 slots a node
        on_rayb = len(rayb.sbxkit_containers())
        supervisor = _supervisor_of(cluster.root / "state-rayb")
        assert supervisor is not None, "no supervisor serves rayb's state dir"
        raylet = cluster.nodes["rayb"].raylet_pid
        assert os.getsid(supervisor) != os.getsid(raylet)  # not in the raylet's session
        assert os.getpgid(supervisor) != os.getpgid(raylet)
        cluster.kill_raylet("rayb")
        # rayb's supervisor outlives the raylet and removes what rayb's agent held.
        left = rayb.wait_until_no_sbxkit_containers(seconds=60.0)
        assert left == [], f"rayb's containers outlived its raylet: {left}"
        os.kill(supervisor, 0)  # the one that removed them is still there
        _, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
    finally:
        interrupt(driver)
    assert driver.returncode == 0, stderr
    lost, retried = ended_once_each(out, 8, lost_on="rayb", lost_count=on_rayb)
    assert all(r["node"] == "raya" for r in retried), retried  # rayb is gone
    assert all("NodeDiedError" in r["error"]["message"] for r in lost), lost
    assert f"{len(lost)} attempts lost and retried" in stderr

    again = run_batch(cluster, jobs, out)  # the results file resumes: nothing left to run
    assert again.returncode == 0, again.stderr
    assert "nothing to do: all 8 jobs have a line" in again.stderr
    cluster.stop_node("rayb")
    cluster.start_node("rayb")  # back for the next tests (its supervisor recovers at join)


def test_an_agent_killed_mid_batch_ends_every_job_once(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    write_jobs(jobs, 8, "sleep 12; echo done")
    driver = start_batch(cluster, jobs, out)
    try:
        rayb = node_witnesses["rayb"]
        wait_for(lambda: running(rayb) == SLOTS, 120, "rayb full")  # 8 jobs, 4 slots a node
        on_rayb = len(rayb.sbxkit_containers())
        agent = _agent_of(rayb.socket_path)
        assert agent is not None, "no sbxkit agent serves rayb's daemon"
        os.kill(agent, signal.SIGKILL)
        left = rayb.wait_until_no_sbxkit_containers(seconds=60.0)  # its supervisor's doing
        assert left == [], f"the killed agent's containers stayed: {left}"
        _, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
    finally:
        interrupt(driver)
    assert driver.returncode == 0, stderr
    lost, _ = ended_once_each(out, 8, lost_on="rayb", lost_count=on_rayb)
    assert all("agent of node rayb died" in r["error"]["message"] for r in lost), lost


def test_a_host_gone_is_cleaned_by_its_recovery_at_restart(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """Ray's processes and the supervisor die together (the host's power, a pod deleted):
    nothing is left to remove rayb's containers until the node comes back, when its agent's
    join starts the supervisor, whose recovery removes them from its journal."""
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    write_jobs(jobs, 8, "sleep 12; echo done")
    driver = start_batch(cluster, jobs, out)
    try:
        rayb = node_witnesses["rayb"]
        wait_for(lambda: running(rayb) == SLOTS, 120, "rayb full")  # 8 jobs, 4 slots a node
        state = cluster.root / "state-rayb"
        assert _supervisor_of(state) is not None, "no supervisor serves rayb's state dir"
        # Everything on the host stops at once: frozen, rayb's callers cannot launch a new
        # supervisor to re-adopt their leases (docs/operations.md), nor can its agent, whose
        # death would have the live supervisor remove the containers.
        frozen = cluster.freeze_node("rayb")
        assert _agent_of(rayb.socket_path) in frozen  # the callers, whose links would relaunch
        # The power goes for every supervisor process of the state dir: the one serving it,
        # and any other still starting (it leaves when it finds the lock taken) or leaving.
        gone = _supervisors_of(state)
        killed = _described(gone)  # before they die: a dead process has no argv to show
        for pid in gone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cluster.kill_node("rayb", also=frozen)
        # A SIGKILLed process keeps its /proc entry until its threads leave the kernel (an
        # fsync under CI's load takes a while); any other supervisor is a relaunch: a failure.
        wait_for(lambda: not _supervisors_of(state) & gone, 30, "rayb's supervisors gone")
        relaunched = _supervisors_of(state)
        assert not relaunched, (
            f"a supervisor was relaunched on a frozen node: {_described(relaunched)} "
            f"(killed: {killed})"
        )
        time.sleep(3)
        stranded = rayb.sbxkit_containers()
        assert stranded, "the test can fail: nothing was left behind on rayb"
        cluster.start_node("rayb")  # same daemon, same state dir: a new node id
        left = rayb.wait_until_no_sbxkit_containers(seconds=90.0)
        assert left == [], f"rayb's recovery at restart left: {left}"
        _, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
    finally:
        interrupt(driver)
    assert driver.returncode == 0, stderr
    final = [r for r in lines(out) if r["status"] != "lost"]
    assert sorted(r["id"] for r in final) == sorted(f"j{i}" for i in range(8))
    assert all(r["status"] == "exited" for r in final), final


def test_ctrl_c_of_the_driver_removes_everything_in_flight(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    write_jobs(jobs, 8, "sleep 100")
    driver = start_batch(cluster, jobs, out)
    try:
        wait_for(
            lambda: all(running(w) >= 2 for w in node_witnesses.values()),
            120,
            "jobs running on both nodes",
        )
        driver.send_signal(signal.SIGINT)
        _, stderr = driver.communicate(timeout=90)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
    assert driver.returncode == 128 + signal.SIGINT, stderr
    assert "every sandbox in flight was removed" in stderr
    for name, witness in node_witnesses.items():  # already gone, not merely later
        assert witness.sbxkit_containers() == [], name
    assert all(r["status"] != "lost" for r in lines(out)) if out.exists() else True


def test_nodes_are_refused_by_name_when_they_join(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    only_a = f"sbxkit-test/cluster-only-a:{THIS_RUN}"
    differs = f"sbxkit-test/cluster-differs:{THIS_RUN}"
    raya, rayb = node_witnesses["raya"], node_witnesses["rayb"]
    _tag(raya, PYTHON, only_a)
    _tag(raya, PYTHON, differs)
    _tag(rayb, "sbxkit-test/busybox:latest", differs)  # same name, other content
    cluster.start_node("rayc", socket=str(tmp_path / "no-daemon.sock"))
    try:
        jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
        write_jobs(jobs, 4, "echo ok", image=only_a)
        done = run_batch(cluster, jobs, out)
        assert done.returncode == 0, done.stderr
        assert "node rayc (" in done.stderr
        assert "refused: no Docker engine" in done.stderr
        # rayb lacks the image: not refused (it would run other images' jobs), just not used
        # for this one's.
        assert "node rayb (" not in done.stderr
        assert {r["node"] for r in lines(out)} == {"raya"}

        jobs2, out2 = tmp_path / "jobs2.jsonl", tmp_path / "results2.jsonl"
        write_jobs(jobs2, 2, "echo ok", image=differs)
        refused = run_batch(cluster, jobs2, out2)
        assert refused.returncode == 69, refused.stderr
        for name in ("raya", "rayb"):
            assert f"node {name} (" in refused.stderr
        assert f"image {differs!r} differs between the nodes" in refused.stderr
        assert not out2.exists() or out2.read_text() == ""
    finally:
        cluster.stop_node("rayc")
        _untag(raya, only_a)
        _untag(raya, differs)
        _untag(rayb, differs)


def test_a_job_whose_image_no_node_has_gets_the_local_error_line_and_the_batch_goes_on(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """Issue 43, item 7: one job naming an image no node has used to refuse every node (each
    lacked an image the batch names) and stop the whole batch (exit 69, nothing run). Now that
    job gets the error line a local batch gives it, a job whose image only raya has runs on
    raya, and the rest run on both nodes."""
    missing = f"sbxkit-test/cluster-nowhere:{THIS_RUN}"
    only_a = f"sbxkit-test/cluster-only-a:{THIS_RUN}"
    raya = node_witnesses["raya"]
    _tag(raya, PYTHON, only_a)
    try:
        images = [PYTHON, missing, PYTHON, only_a, PYTHON, only_a, PYTHON, PYTHON]
        jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
        jobs.write_text(
            "".join(
                json.dumps(
                    {"id": f"j{i}", "image": image, "command": ["echo", "ok"], "limits": LIMITS}
                )
                + "\n"
                for i, image in enumerate(images)
            )
        )
        done = run_batch(cluster, jobs, out)
        # The same job alone in a local batch, on raya's daemon (refused before any supervisor
        # or container is needed).
        local_jobs, local_out = tmp_path / "local.jsonl", tmp_path / "local-results.jsonl"
        local_jobs.write_text(jobs.read_text().splitlines()[1] + "\n")
        local = subprocess.run(
            [sys.executable, "-m", "sbxkit", "batch", str(local_jobs), "--out", str(local_out)],
            cwd=REPO,
            env={
                **os.environ,
                "DOCKER_HOST": f"unix://{raya.socket_path}",
                "SBXKIT_STATE_DIR": str(tmp_path / "local-state"),
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        _untag(raya, only_a)
    assert local.returncode == 1, local.stderr
    assert done.returncode == local.returncode, done.stderr  # 1: a job ended with an error
    assert "refused" not in done.stderr, done.stderr
    by_id = {r["id"]: r for r in lines(out)}
    assert sorted(by_id) == [f"j{i}" for i in range(len(images))]
    [local_line] = lines(local_out)
    error_line = by_id["j1"]
    assert error_line["status"] == local_line["status"] == "error", error_line
    assert error_line["error"]["type"] == local_line["error"]["type"] == "ImageError"
    assert error_line["error"]["message"].startswith(f"image {missing!r}: not present")
    assert "never pulls" in error_line["error"]["message"]
    assert set(local_line) <= set(error_line), set(local_line) - set(error_line)
    ran = {i: r for i, r in by_id.items() if i != "j1"}
    assert all(r["status"] == "exited" and r["stdout"] == "ok\n" for r in ran.values()), ran
    assert {ran["j3"]["node"], ran["j5"]["node"]} == {"raya"}
    assert not (tmp_path / "local-state").exists()  # the local batch started no supervisor


def test_parallel_beyond_the_nodes_cpus_queues_instead_of_starting_ray_workers(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """Issue 43, item 7: with nodes advertising 64 sandboxes, ``--parallel 64`` used to put 64
    relays on the nodes at once, each a Ray worker process of its own (a worker start each, on
    two shared cores). A relay now holds one of its node's Ray CPUs while its job runs, so each
    node runs at most NODE_CPUS relays and the rest wait in Ray: the Ray worker processes on
    each node, sampled through the batch, stay within NODE_CPUS relays + 1 agent + NODE_CPUS
    idle workers Ray keeps warm."""
    wide = {"sbxkit_sandboxes": 64, "sbxkit_memory_mib": 8192}
    count = 64
    names = tuple(node_witnesses)
    for name in names:
        cluster.stop_node(name)
        cluster.start_node(name, resources=wide)
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    write_jobs(jobs, count, "echo done")
    most = dict.fromkeys(names, 0)
    driver = start_batch(cluster, jobs, out, "--parallel", str(count))
    try:
        deadline = time.monotonic() + BATCH_TIMEOUT_S
        while driver.poll() is None and time.monotonic() < deadline:
            for name, witness in node_witnesses.items():
                most[name] = max(most[name], len(ray_workers(witness.socket_path)))
            time.sleep(0.1)
        _, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
    finally:
        interrupt(driver)
        for name in names:
            cluster.stop_node(name)
            cluster.start_node(name)
    assert driver.returncode == 0, stderr
    results = lines(out)
    assert sorted(r["id"] for r in results) == sorted(f"j{i}" for i in range(count))
    assert all(r["status"] == "exited" and r["stdout"] == "done\n" for r in results)
    assert {r["node"] for r in results} == set(names)
    bound = NODE_CPUS + 1 + NODE_CPUS
    assert all(0 < seen <= bound for seen in most.values()), (most, bound)


def _host(listener: str) -> str:
    """``[::ffff:127.0.0.1]:6379 users:...`` → ``127.0.0.1``."""
    return listener.split()[0].rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")


def _tag(witness: Witness, image: str, as_name: str) -> None:
    repo, _, tag = as_name.rpartition(":")
    response = witness.session.post(
        f"{witness.base}/images/{image}/tag", params={"repo": repo, "tag": tag}, timeout=30
    )
    response.raise_for_status()


def _untag(witness: Witness, name: str) -> None:
    witness.session.delete(f"{witness.base}/images/{name}", params={"noprune": "1"}, timeout=30)


def start_batch(cluster: LocalCluster, jobs: Path, out: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        batch_argv(cluster, jobs, out, *flags),
        cwd=REPO,
        env=cluster.driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt(driver: subprocess.Popen[str]) -> None:
    """A driver a failed assertion left running: Ctrl-C it (it removes what it runs)."""
    if driver.poll() is None:
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=90)


def _agent_of(socket_path: str) -> int | None:
    """The pid of the sbxkit agent (a Ray worker) whose node is bound to ``socket_path``."""
    wanted = f"DOCKER_HOST=unix://{socket_path}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"NodeAgent" not in (entry / "cmdline").read_bytes():
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def _supervisors_of(state_dir: Path) -> set[int]:
    """Every process started as the supervisor of ``state_dir`` (read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sbxkit.supervisor" in argv and str(state_dir).encode() in argv:
            found.add(int(entry.name))
    return found


def _supervisor_of(state_dir: Path) -> int | None:
    """The supervisor serving ``state_dir``: the process holding its instance lock, as
    /proc/locks names it (a second process may be starting, and leaves when it finds the lock
    taken); None if nobody holds it."""
    try:
        lock = (state_dir / LOCK_NAME).stat()
    except FileNotFoundError:
        return None
    device = (os.major(lock.st_dev), os.minor(lock.st_dev))
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a blocked waiter's line ("N: -> FLOCK …") is not the holder's
        major, minor, inode = fields[5].split(":")
        if (int(major, 16), int(minor, 16), int(inode)) == (*device, lock.st_ino):
            return int(fields[4])
    return None


def _described(pids: set[int]) -> str:
    """Each pid with its parent and command line, for a failure's message."""
    parts = []
    for pid in sorted(pids):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            parent = next(line.split()[1] for line in status.splitlines() if line[:5] == "PPid:")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            parts.append(f"{pid} (parent {parent}): {argv.strip()}")
        except (OSError, StopIteration):
            parts.append(f"{pid} (gone)")
    return "; ".join(parts) or "none"
