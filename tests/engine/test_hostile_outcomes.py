"""Results a hostile payload cannot falsify (issue 12, item 1), on the real engine.

- A child OOM-killed while the payload's main process exits 5 by itself is an exit 5, with the
  OOM noted as evidence — not the payload's ``oom_killed``; on the kernel path the note is the
  host's count of the sandbox's memory cgroup, with no daemon call.
- In a session, an earlier exec's OOM does not make a later exec's own ``kill -9 $$`` an OOM:
  an exec is judged on the events of its own window, not on the container's sticky flag.
- A process left behind by one exec, which reads later execs' tokens from ``/proc`` and plants
  the files an older wrapper obeyed, cannot cancel them or make them look killed: every later
  exec runs its command and reports its own output and exit.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import sbxkit
from sbxkit._kernel.init import OomWatch
from sbxkit.engine.client import Engine
from tests.engine.helpers import spec
from tests.engine.oneshot_paths import OneShot
from tests.engine.test_cli import one_json_object, run_cli
from tests.witness import Witness


def daemon_order(witness: Witness, container_id: str, since: float) -> list[str]:
    """The daemon's ``oom`` and ``die`` events for the container, in its own order (waiting
    up to 10 s for a late ``oom``)."""
    deadline = time.monotonic() + 10
    while True:
        events = witness.events(
            since, time.time(), type=["container"], container=[container_id], event=["oom", "die"]
        )
        order = [e["Action"] for e in sorted(events, key=lambda e: e["timeNano"])]
        if "oom" in order or time.monotonic() > deadline:
            return order
        time.sleep(0.2)


CHILD_OOM = 'python3 -c "x = bytearray(512 * 2**20)"; echo child=$?; exit 5'


async def test_a_child_oom_while_the_payload_exits_5_is_exit_5(
    oneshot: OneShot, engine: Engine, python_image: str, witness: Witness
) -> None:
    since = time.time()
    result = await oneshot(
        spec(python_image, CHILD_OOM, memory_bytes=64 * sbxkit.MiB), engine=engine
    )
    assert result.stdout == b"child=137\n"  # the child really was OOM-killed
    assert (result.status, result.exit_code) == ("exited", 5), result
    if result.oom_evidence is None and result.evidence == "daemon":
        # On the daemon's word, the note is its OOMKilled flag as it stood after the exit. A
        # loaded daemon may handle the shim's OOM event after the exit: then it did not know
        # yet, which its own event order proves. Known before the exit, the note is required.
        order = daemon_order(witness, result.container_id, since)
        assert order.index("oom") > order.index("die"), order
        return
    assert result.oom_evidence is not None
    assert "a process in the sandbox was OOM-killed" in result.oom_evidence
    assert "exited 5 by itself" in result.oom_evidence


async def test_a_child_oom_the_host_could_not_count_is_the_daemons_note_on_the_kernels_exit(
    engine: Engine, python_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox's memory cgroup gone before the host read it (a loaded host: the daemon's
    exit path removed it first): the exit stays the kernel's, the child's OOM is the daemon's
    note — not a fall back to the daemon's evidence for the whole result."""

    async def cannot_tell(self: OomWatch) -> None:
        return None

    monkeypatch.setattr(OomWatch, "kills", cannot_tell)
    result = await sbxkit.run(
        spec(python_image, CHILD_OOM, memory_bytes=64 * sbxkit.MiB), engine=engine
    )
    assert result.stdout == b"child=137\n"
    assert (result.status, result.exit_code, result.evidence) == ("exited", 5, "kernel"), result
    note = result.oom_evidence
    assert note is not None, result
    assert "exited 5 by itself" in note
    assert "memory cgroup counted" not in note  # the daemon's record, not the host's count


async def test_a_child_oom_is_the_hosts_count_with_no_daemon_call(
    engine: Engine, busybox: str, python_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the kernel path the child's OOM kill is counted on the host from the sandbox's memory
    cgroup — v1: its OOM eventfd; v2: its ``memory.events``, watched while the payload runs
    (the cgroup is usually gone by the exit) — so the verdict asks the daemon nothing: no
    inspection, no wait. The first run learns the daemon's cgroup layout (``State.Pid``)."""
    first = await sbxkit.run(spec(busybox, "exit 3"), engine=engine)
    assert (first.evidence, first.exit_code) == ("kernel", 3), first
    asked: list[str] = []
    inspect, wait = engine.container_inspect, engine.container_wait

    async def counted_inspect(container_id: str) -> Any:
        asked.append(f"inspect {container_id}")
        return await inspect(container_id)

    async def counted_wait(container_id: str, condition: str = "next-exit") -> Any:
        asked.append(f"wait {container_id} {condition}")
        return await wait(container_id, condition)

    monkeypatch.setattr(engine, "container_inspect", counted_inspect)
    monkeypatch.setattr(engine, "container_wait", counted_wait)
    result = await sbxkit.run(
        spec(python_image, CHILD_OOM, memory_bytes=64 * sbxkit.MiB), engine=engine
    )
    assert result.stdout == b"child=137\n"  # the child really was OOM-killed
    assert (result.status, result.exit_code, result.evidence) == ("exited", 5, "kernel"), result
    assert result.oom_evidence is not None, result
    assert "the sandbox's memory cgroup counted 1 OOM kill(s)" in result.oom_evidence, result
    assert "exited 5 by itself" in result.oom_evidence
    assert asked == [], (asked, result)


def test_the_cli_exits_with_the_payloads_own_code_after_a_child_oom(
    python_image: str, witness: Witness
) -> None:
    proc = run_cli(witness, python_image, "sh", "-c", CHILD_OOM, options=("--json",))
    assert proc.returncode == 5, proc.stderr  # not 137
    doc = one_json_object(proc)
    assert (doc["status"], doc["exit_code"]) == ("exited", 5)


async def test_an_earlier_execs_oom_is_not_a_later_execs(engine: Engine, python_image: str) -> None:
    session = spec(python_image, "true", memory_bytes=64 * sbxkit.MiB, pids=64)
    async with sbxkit.open_sandbox(session, engine=engine) as sandbox:
        oom = await sandbox.exec(["python3", "-c", "x = bytearray(512 * 2**20)"], timeout=60)
        assert oom.status == "oom_killed", oom  # positive control: this one was
        own = await sandbox.exec(["sh", "-c", "kill -9 $$"], timeout=60)
        assert (own.status, own.exit_code) == ("exited", 137), own
        assert own.oom_evidence is None


# Plants ``.cancel`` markers (what the old wrapper obeyed) and garbage group records for every
# exec token it sees in /proc; logs the tokens, so the test knows the attack was under way.
HOSTILE_WATCHER = r"""
while :; do
  for d in /proc/[0-9]*; do
    c=$(tr "\000" " " <"$d/cmdline" 2>/dev/null) || continue
    case "$c" in
      *"sbxkit-exec "*)
        t=${c#*sbxkit-exec }; t=${t%% *}
        case "$t" in *[!0-9a-f]*|"") continue;; esac
        : >"/tmp/.sbxkit-exec-$t.cancel" 2>/dev/null
        grep -qx "$t" /tmp/seen 2>/dev/null || echo "$t" >>/tmp/seen;;
    esac
  done
done
"""


async def test_a_left_behind_process_cannot_cancel_later_execs(
    engine: Engine, busybox: str
) -> None:
    session = spec(busybox, "true", pids=256)
    async with sbxkit.open_sandbox(session, engine=engine) as sandbox:
        started = await sandbox.exec(
            ["sh", "-c", f"setsid sh -c '{HOSTILE_WATCHER}' </dev/null >/dev/null 2>&1 &"],
            timeout=30,
        )
        assert started.ok, started
        results = [
            await sandbox.exec(["sh", "-c", f"sleep 0.2; echo run{n}"], timeout=30)
            for n in range(5)
        ]
        for n, result in enumerate(results):
            assert (result.status, result.exit_code, result.stdout) == (
                "exited",
                0,
                f"run{n}\n".encode(),
            ), result
        await sandbox.put_files({"job/x.txt": b"data"})  # an exec too: it must not fail
        seen = await sandbox.get_files(["seen"])
        # Positive control: the watcher saw (and attacked) the later execs' tokens.
        assert len(seen["seen"].split()) >= 5
