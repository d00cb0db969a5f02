"""A session detached in one process and continued in another (issue 40, item 4).

Each test runs its own supervisor (``running_supervisor``: its log is the test's to read) and
proves through the independent witness where the container is: alive after its first process
exited, gone once the second's block ended (or it was killed, or nobody came by the keep
deadline), created and destroyed exactly once. The second process is a real one
(tests/engine/reattach_caller.py) given the handle's JSON on stdin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import trio

from sbxkit import blocking
from sbxkit._consumers.handle import SandboxHandle
from sbxkit._consumers.reattach import attach_sandbox
from sbxkit._consumers.session import open_sandbox
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.settings import Settings
from sbxkit.engine.client import Engine
from sbxkit.errors import ReattachRefused, SandboxUnusable, SbxError
from tests.engine.helpers import spec
from tests.engine.test_readoption import records, removed_exactly_once
from tests.supervision import running_supervisor
from tests.witness import LEASE_LABEL, SOCKET, Witness

CALLER = Path(__file__).with_name("reattach_caller.py")


@pytest.fixture(autouse=True)
def no_auto_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the test's own supervisor serves (a second would hide what the first did)."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")


def caller(*argv: str, stdin: bytes | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CALLER), *argv],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


async def finished(proc: subprocess.Popen[bytes], stdin: bytes | None = None) -> tuple[int, str]:
    out, err = await trio.to_thread.run_sync(lambda: proc.communicate(stdin, timeout=120))
    assert proc.returncode in (0, 3), (proc.returncode, out, err)
    return proc.returncode, out.decode()


def alive(witness: Witness, lease: str) -> bool:
    return any(
        c.get("State") == "running" for c in witness.containers(label=f"{LEASE_LABEL}={lease}")
    )


async def test_a_second_process_continues_a_detached_session(
    witness: Witness, state_dir: Path, busybox: str
) -> None:
    since = time.time()
    with running_supervisor(state_dir, "--persistent") as sup:
        status, out = await finished(caller("open", str(state_dir), busybox, "60"))
        assert status == 0, out
        handle = SandboxHandle.from_json(out)
        assert handle.secret not in repr(handle)
        lease = handle.lease
        # The first process exited: its connection is gone, the container lives on.
        await trio.sleep(1.0)
        assert alive(witness, lease), "the detached container survives its first process"
        assert records(state_dir) == [lease]
        journaled = (state_dir / f"{lease}.lease").read_text()
        assert handle.secret not in journaled
        assert json.loads(journaled)["detached_until"] == pytest.approx(handle.keep_until)
        status, out = await finished(caller("attach", stdin=b""), handle.to_json())
        assert status == 0, out
        seen = json.loads(out)
        assert (seen["stdout"], seen["exit_code"], seen["lease"]) == (
            "written by the first process",
            0,
            lease,
        )
        print(f"reattach latency {seen['attach_s'] * 1000:.1f} ms")
        await removed_exactly_once(witness, state_dir, lease, since)
        log = sup.log()
    assert f"lease {lease}: detached by its caller" in log
    assert f"lease {lease}: reattached by a new caller" in log
    assert handle.secret not in log


async def test_wrong_unknown_and_spent_handles_are_refused_and_logged(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """None of them touches the lease: the right handle then reattaches it, once."""
    since = time.time()
    owner = SupervisedOwner(engine, state_dir=state_dir)
    with running_supervisor(state_dir, "--persistent") as sup:
        async with open_sandbox(
            spec(busybox, "true", timeout_s=60), engine=engine, owner=owner
        ) as box:
            await box.put_files({"note.txt": b"kept"})
            handle = await box.detach(60)
            with pytest.raises(SandboxUnusable, match="detached"):
                await box.exec(["true"])
        lease = handle.lease
        assert alive(witness, lease)

        async def refused(forged: SandboxHandle) -> tuple[str, bool]:
            with pytest.raises(ReattachRefused) as caught:
                async with attach_sandbox(forged):
                    raise AssertionError("reattached with a forged handle")
            return caught.value.reason, caught.value.ended

        wrong = await refused(msgspec.structs.replace(handle, secret=os.urandom(32).hex()))
        unknown = await refused(msgspec.structs.replace(handle, lease=os.urandom(16).hex()))
        assert "wrong secret" in wrong[0]
        assert not wrong[1]  # refused for cause: no reason to make another
        assert "no record of the lease" in unknown[0]
        assert unknown[1]
        assert alive(witness, lease), "a refusal leaves the lease as it was"
        async with attach_sandbox(handle) as again:
            assert (await again.exec(["cat", "/tmp/note.txt"])).stdout == b"kept"
            spent = await refused(handle)  # while the first reattach holds it
        assert "replayed secret" in spent[0]
        assert not spent[1]
        await removed_exactly_once(witness, state_dir, lease, since)
        ended = await refused(handle)
        assert ("replayed secret" in ended[0] and not ended[1]) or (
            "no record" in ended[0] and ended[1]
        )
        log = sup.log()
    assert f"lease {lease}: not reattached: refused: wrong secret" in log
    assert f"lease {lease}: not re-adopted: refused: replayed secret" in log
    assert handle.secret not in log


async def test_a_detached_lease_nobody_reattaches_is_removed_at_its_keep_deadline(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    since = time.time()
    owner = SupervisedOwner(engine, state_dir=state_dir)
    with running_supervisor(state_dir, "--persistent") as sup:
        async with open_sandbox(
            spec(busybox, "true", timeout_s=60), engine=engine, owner=owner
        ) as box:
            handle = await box.detach(3)
        lease = handle.lease
        assert handle.keep_until == pytest.approx(time.time() + 3, abs=1.0)
        await trio.sleep(1.0)
        assert alive(witness, lease), "kept until its deadline"
        await removed_exactly_once(witness, state_dir, lease, since)
        gone_at = time.time()
        assert gone_at - handle.keep_until < 3.0, "removed at its keep deadline"
        with pytest.raises(ReattachRefused, match="no record of the lease") as caught:
            async with attach_sandbox(handle):
                pass
        assert caught.value.ended  # over, not refused for cause: a caller may make another
        log = sup.log()
    assert f"lease {lease}: detached and not reattached by its keep deadline" in log


async def test_a_killed_reattached_process_leaves_nothing(
    witness: Witness, state_dir: Path, busybox: str
) -> None:
    since = time.time()
    with running_supervisor(state_dir, "--persistent"):
        status, out = await finished(caller("open", str(state_dir), busybox, "60"))
        assert status == 0, out
        handle = SandboxHandle.from_json(out)
        holder = caller("hold", stdin=b"")
        try:
            assert holder.stdin is not None
            assert holder.stdout is not None
            holder.stdin.write(handle.to_json())
            holder.stdin.close()
            line = await trio.to_thread.run_sync(holder.stdout.readline)
            assert line.split() == [b"attached", handle.lease.encode()], line
            holder.send_signal(signal.SIGKILL)
        finally:
            holder.kill()
            holder.wait(10)
        await removed_exactly_once(witness, state_dir, handle.lease, since)


async def test_a_restarted_supervisor_keeps_the_handle_and_the_deadline(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """SIGKILL the supervisor while two leases are detached: the next one honours the
    reattach of one and removes the other at its keep deadline, from their records."""
    since = time.time()
    owner = SupervisedOwner(engine, state_dir=state_dir)
    handles = []
    with running_supervisor(state_dir, "--persistent") as first:
        for keep in (60, 4):
            async with open_sandbox(
                spec(busybox, "true", timeout_s=60), engine=engine, owner=owner
            ) as box:
                await box.put_files({"note.txt": f"kept {keep}".encode()})
                handles.append(await box.detach(keep))
        first.kill()
    kept, short = handles
    with running_supervisor(state_dir, "--persistent") as second:
        async with attach_sandbox(kept) as box:
            assert (await box.exec(["cat", "/tmp/note.txt"])).stdout == b"kept 60"
        await removed_exactly_once(witness, state_dir, kept.lease, since)
        assert short.keep_until > time.time() or not alive(witness, short.lease)
        await removed_exactly_once(witness, state_dir, short.lease, since)
        assert time.time() >= short.keep_until - 0.5, "not before its keep deadline"
        log = second.log()
    assert "holding 2 detached lease(s)" in log
    assert f"lease {kept.lease}: re-adopted by its caller" in log
    assert (
        f"lease {short.lease}: expired unclaimed: it was detached and nobody reattached it" in log
    )


async def test_detach_refuses_what_it_cannot_keep(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """A keep that is not a positive number is refused before anything changes; the session
    goes on, and the block's end removes it as always."""
    since = time.time()
    owner = SupervisedOwner(engine, state_dir=state_dir)
    with running_supervisor(state_dir, "--persistent"):
        async with open_sandbox(
            spec(busybox, "true", timeout_s=60), engine=engine, owner=owner
        ) as box:
            for bad in (0, -1, float("inf"), float("nan")):
                with pytest.raises(SbxError, match="keep_s"):
                    await box.detach(bad)
            assert (await box.exec(["echo", "still here"])).stdout == b"still here\n"
            lease = box.lease
        await removed_exactly_once(witness, state_dir, lease, since)


def test_the_blocking_api_detaches_and_attaches(
    witness: Witness, state_dir: Path, busybox: str
) -> None:
    settings = Settings(supervisor_state_dir=str(state_dir))
    with running_supervisor(state_dir, "--persistent"):
        with blocking.open_sandbox(
            spec(busybox, "true", timeout_s=60), settings=settings, socket_path=SOCKET
        ) as box:
            box.put_files({"note.txt": b"blocking"})
            handle = box.detach(30)
        assert alive(witness, handle.lease)
        with blocking.attach_sandbox(handle) as again:
            assert again.exec(["cat", "/tmp/note.txt"]).stdout == b"blocking"
        assert not witness.wait_until_no_sbxkit_containers(seconds=10.0)
        assert records(state_dir) == []
