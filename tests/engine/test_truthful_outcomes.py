"""Truthful outcomes against the real engine: an operator's ``docker kill`` (sent through the
witness, as an operator would) is ``killed``, not ``oom_killed``; the payload's own ``exit 137``
is an exit; a real OOM stays ``oom_killed`` with the daemon's evidence."""

from __future__ import annotations

import threading
import time

import trio

import sbxkit
from sbxkit._lifecycle.outcome import EVIDENCE_GRACE_S, judge_exit
from sbxkit._protocol.wire import Expiring
from sbxkit.engine.client import Engine
from tests.engine.helpers import (
    create_plain_container,
    python_spec,
    spec,
    unique,
    wait_until,
)
from tests.engine.oneshot_paths import OneShot
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"


def labelled(base: sbxkit.SandboxSpec, label: str) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=base.image, command=base.command, limits=base.limits, labels={TEST_LABEL: label}
    )


def kill_when_running(witness: Witness, label: str, process: str) -> threading.Thread:
    """An operator killing the container once ``process`` runs in it (seen by the daemon)."""

    def operator() -> None:
        found: list[str] = []

        def running() -> bool:
            found[:] = [
                c["Id"]
                for c in witness.containers(label=f"{TEST_LABEL}={label}")
                if c.get("State") == "running"
                and any(process in " ".join(row) for row in _top(witness, c["Id"]))
            ]
            return bool(found)

        if wait_until(running, 30):
            witness.kill(found[0])

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    return thread


def _top(witness: Witness, container_id: str) -> list[list[str]]:
    try:
        rows: list[list[str]] = witness.get(f"/containers/{container_id}/top")["Processes"] or []
    except Exception:  # stopped between the listing and this call
        return []
    return rows


async def test_an_operators_docker_kill_is_killed_not_oom(
    oneshot: OneShot, engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("kill")
    operator = kill_when_running(witness, label, "sleep 30")
    result = await oneshot(labelled(spec(busybox, "sleep 30"), label), engine=engine)
    operator.join(5)
    assert result.status == "killed", result
    assert result.exit_code is None  # the kill's 137 is no answer of the payload's
    assert result.oom_evidence is None
    assert result.kill_evidence is not None
    assert "SIGKILL" in result.kill_evidence


def sleeping_helper(witness: Witness, image: str, name: str) -> str:
    """A plain container running ``sleep 30``, made and started through the witness (not
    sbxkit): the judge's subject. The caller removes it."""
    response = witness.session.post(
        f"{witness.base}/containers/create",
        params={"name": name},
        json={"Image": image, "Cmd": ["sleep", "30"], "Labels": {"sbxkit-tests.helper": "1"}},
        timeout=30,
    )
    response.raise_for_status()
    helper: str = response.json()["Id"]
    started = witness.session.post(f"{witness.base}/containers/{helper}/start", timeout=30)
    if started.status_code != 204:
        witness.remove(helper)
        started.raise_for_status()
    return helper


async def test_evidence_that_comes_after_the_exit_is_waited_for(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    """The daemon may handle a container's ``oom`` after its exit (the shim watches the cgroup
    and reaps in two goroutines; seen once under CI's load): a signal exit nothing explains
    yet waits up to EVIDENCE_GRACE_S for it. Here the late evidence is a real ``docker kill``
    sent 0.3 s into the judging; with nothing at all, the grace passes and it is an exit."""
    helper = sleeping_helper(witness, busybox, unique("late-evidence"))
    helpers = [helper]
    try:
        async with trio.open_nursery() as nursery:

            async def kill_later() -> None:
                await trio.sleep(0.3)
                await trio.to_thread.run_sync(witness.kill, helper)

            nursery.start_soon(kill_later)
            verdict = await judge_exit(engine, helper, 137)
        assert verdict.status == "killed", verdict
        quiet = create_plain_container(witness, busybox, unique("no-evidence"))  # runs `true`
        helpers.append(quiet)
        witness.session.post(f"{witness.base}/containers/{quiet}/start", timeout=30)
        began = trio.current_time()
        assert (await judge_exit(engine, quiet, 137)).status == "exited"
        assert trio.current_time() - began >= EVIDENCE_GRACE_S
    finally:
        for container in helpers:
            witness.remove(container)


async def test_a_payloads_own_exit_137_is_an_exit(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    result = await oneshot(spec(busybox, "exit 137"), engine=engine)
    assert (result.status, result.exit_code) == ("exited", 137)
    assert result.oom_evidence is None
    assert result.kill_evidence is None


def missed_by_docker_20_10_on_cgroup_v2(
    witness: Witness, result: sbxkit.RunResult, since: float
) -> bool:
    """Docker 20.10 on cgroup v2 misses some OOM kills of a container's init: containerd's
    watch of ``memory.events`` loses the race with the scope's removal, so neither the flag
    nor an ``oom`` event ever comes (docs/backends.md). True only for that daemon, a result
    on the daemon's evidence, and no ``oom`` event for the container even now, after the
    run: sbxkit reported the exit the daemon saw, and nothing the daemon said was lost."""
    info = witness.get("/info")
    if not (str(info.get("ServerVersion", "")).startswith("20.10.")):
        return False
    if str(info.get("CgroupVersion")) != "2" or result.evidence != "daemon":
        return False
    oom = {"type": ["container"], "container": [result.container_id], "event": ["oom"]}
    return not witness.events(since, time.time(), **oom)


async def test_a_real_oom_is_oom_killed_on_the_daemons_evidence(
    oneshot: OneShot, engine: Engine, python_image: str, witness: Witness
) -> None:
    code = "b = bytearray(200 << 20)"
    since = time.time()
    result = await oneshot(python_spec(python_image, code, memory_bytes=32 << 20), engine=engine)
    if result.status == "exited" and missed_by_docker_20_10_on_cgroup_v2(witness, result, since):
        # The daemon's own miss, reported as the exit it is: a signal exit, no evidence.
        assert (result.exit_code, result.oom_evidence, result.kill_evidence) == (137, None, None)
        return
    assert result.status == "oom_killed", result
    assert result.oom_evidence in ("State.OOMKilled",) or "oom event" in (result.oom_evidence or "")


async def test_docker_kill_of_a_sandbox_during_an_exec_is_reported_as_killed(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("kill")
    async with sbxkit.open_sandbox(labelled(spec(busybox, "true"), label), engine=engine) as box:
        operator = kill_when_running(witness, label, "sleep 29")
        result = await box.exec(["sleep", "29"])
        operator.join(5)
    assert result.status == "killed", result
    assert result.kill_evidence is not None


async def test_a_container_removed_before_its_judging_is_judged_on_its_events(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    """The owner's removal can win the race with a kernel path run's judging (CI's Docker 26.1
    once: the supervisor's own removal at a lifetime deadline, a 404 at the judge's inspect).
    The container's events outlive it: a removed container's SIGKILL is still someone's kill,
    and a removal its owner decided is still sbxkit's own."""
    helper = sleeping_helper(witness, busybox, unique("removed-first"))
    try:
        witness.kill(helper)
    finally:
        witness.remove(helper)
    assert not [c for c in witness.containers() if c["Id"] == helper]
    verdict = await judge_exit(engine, helper, 137)
    assert verdict.status == "killed", verdict
    assert verdict.kill_evidence is not None
    assert "SIGKILL" in verdict.kill_evidence

    async def owners_reason() -> Expiring:
        await trio.lowlevel.checkpoint()
        return Expiring(lease="0" * 32, reason="lifetime deadline reached")

    verdict = await judge_exit(engine, helper, 137, ended_by_owner=owners_reason)
    assert verdict.status == "timed_out", verdict
    assert verdict.kill_evidence == "sbxkit's own removal: lifetime deadline reached"

    async def over_its_disk() -> Expiring:
        await trio.lowlevel.checkpoint()
        return Expiring(lease="0" * 32, reason="past its bound", status="disk_exceeded")

    verdict = await judge_exit(engine, helper, 137, ended_by_owner=over_its_disk)
    assert verdict.status == "disk_exceeded", verdict
    assert verdict.kill_evidence == "sbxkit's own removal: past its bound"
