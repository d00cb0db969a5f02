"""Each sandbox runs as a uid of its own (issue 38, finding 4; docs/security.md).

The default uid used to be 65534, the host's ``nobody``, shared by every sandbox of every
caller: a host process running as ``nobody`` read a live sandbox's ``/proc/PID/environ`` (its
API token) and memory, and one payload that took every inotify instance of the uid left the
next sandbox with ``inotify_init: Too many open files``. Here each finding is attempted again
against the real engine, and the owner's hold on each uid is checked from the host: held while
the container may exist, recorded in the supervisor's lease record, let go after, and a uid
some other process holds is never handed out (the run is planned under another lease).
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._lifecycle.uid_holds import UidHold, abstract_name, hold_uid, host_id_problem
from sbxkit._model.uids import HOST_UIDS, uid_for_lease
from sbxkit._protocol.journal import default_state_dir
from sbxkit._protocol.records import RECORD_SUFFIX, decode_record
from sbxkit.backends import docker as docker_backend
from sbxkit.engine.client import Engine
from tests.engine.helpers import python_spec, spec, text, unique
from tests.engine.test_readoption import crash, eventually, readopted, supervised  # noqa: F401
from tests.witness import Witness

SECRET = "API_TOKEN=" + "s3cr3t" * 4
NOBODY = 65534
INOTIFY = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
{body}
"""
TAKE_ALL = INOTIFY.format(
    body="""
taken = []
while True:
    fd = libc.inotify_init()
    if fd < 0:
        break
    taken.append(fd)
print("took", len(taken), os.strerror(ctypes.get_errno()), flush=True)
time.sleep(float(sys.argv[1]))
"""
)
TAKE_ONE = INOTIFY.format(
    body="""
fd = libc.inotify_init()
print("one", "ok" if fd >= 0 else os.strerror(ctypes.get_errno()), flush=True)
"""
)


def own_uid(user: str) -> int:
    uid, _, gid = user.partition(":")
    assert uid == gid, user
    return int(uid)


def record_uid(lease: str) -> int | None:
    """The uid the supervisor's lease record holds (the suite's own state dir)."""
    path = default_state_dir() / (lease + RECORD_SUFFIX)
    return decode_record(str(path), path.read_bytes()).uid


def held_elsewhere(uid: int) -> bool:
    """Some other process holds ``uid`` now (our own try gets nothing, and lets go at once)."""
    held = hold_uid(uid, HOST_UIDS)
    if isinstance(held, UidHold):
        held.release()
        return False
    return "held by another process" in held


def init_pid(witness: Witness, container_id: str) -> int:
    pid = witness.get(f"/containers/{container_id}/json")["State"]["Pid"]
    assert isinstance(pid, int)
    assert pid > 0
    return pid


async def test_two_live_sandboxes_run_as_uids_of_their_own_held_and_recorded(
    busybox: str, engine: Engine
) -> None:
    script_spec = spec(busybox, "sleep 60")
    async with (
        open_sandbox(script_spec, engine=engine) as a,
        open_sandbox(script_spec, engine=engine) as b,
    ):
        uids = [own_uid(a.user), own_uid(b.user)]
        assert uids[0] != uids[1]
        for box, uid in zip((a, b), uids, strict=True):
            assert uid == uid_for_lease(box.lease, HOST_UIDS)
            assert host_id_problem(uid) is None  # no host account, group or subordinate id
            ids = await box.exec(["sh", "-c", "id -u; id -g; id -G"])
            assert text(ids.stdout).split() == [str(uid)] * 3
            assert record_uid(box.lease) == uid  # recorded in the lease, for a restart
            assert held_elsewhere(uid)  # the supervisor holds it while the container lives
    assert not any(held_elsewhere(uid) for uid in uids)  # let go once they are gone


async def test_a_host_process_of_the_old_shared_uid_cannot_read_a_sandboxs_secrets(
    busybox: str, engine: Engine, witness: Witness
) -> None:
    """The finding: ``setpriv --reuid 65534 cat /proc/PID/environ`` printed a sandbox's token
    while every sandbox ran as the host's nobody. The same read, and one of its memory."""
    name, _, value = SECRET.partition("=")
    async with open_sandbox(spec(busybox, "sleep 60", env={name: value}), engine=engine) as box:
        pid = init_pid(witness, box.container_id)
        assert os.stat(f"/proc/{pid}").st_uid == own_uid(box.user)
        environ = await trio.Path(f"/proc/{pid}/environ").read_bytes()
        assert SECRET.encode() in environ  # root's own read: the control
        as_nobody = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--",
            "sh",
            "-c",
            f'cat /proc/{pid}/environ; echo "environ=$?"; '
            f'dd if=/proc/{pid}/mem bs=1 count=1 2>&1; echo "mem=$?"',
        ]
        seen = await trio.run_process(
            as_nobody, capture_stdout=True, capture_stderr=True, check=False
        )
    out = seen.stdout + seen.stderr
    assert SECRET.encode() not in out
    assert b"environ=1" in out, out
    assert b"mem=1" in out, out
    assert b"Permission denied" in out, out


async def test_one_payload_using_up_its_inotify_instances_leaves_anothers(
    python_image: str,
) -> None:
    """Per-uid kernel limits stop at the sandbox: A takes every inotify instance its uid may
    have and holds them; B, started meanwhile, still gets one."""
    limit = int(await trio.Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    took = trio.Event()
    heard_from_a: list[bytes] = []

    def heard(stream: str, chunk: bytes) -> None:
        heard_from_a.append(chunk)
        if b"\n" in b"".join(heard_from_a):
            took.set()

    async def hog() -> None:
        await run(python_spec(python_image, TAKE_ALL, "30", timeout_s=60), on_output=heard)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hog)
        with trio.fail_after(60):
            await took.wait()
        other = await run(python_spec(python_image, TAKE_ONE, timeout_s=30))
        nursery.cancel_scope.cancel()  # A has shown what it had to: removed now
    # A used up what its uid may have: the host's whole per-user limit, then EMFILE.
    assert text(b"".join(heard_from_a)).strip() == f"took {limit} Too many open files"
    assert other.ok, other
    assert text(other.stdout).split() == ["one", "ok"]


async def test_a_held_uid_is_never_handed_out_the_run_takes_another_lease(
    busybox: str, witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the uid of the first lease the run is planned under: the
    supervisor refuses it before journaling or creating anything, and the run goes on under a
    new lease with another uid."""
    squatted = secrets.token_hex(16)
    uid = uid_for_lease(squatted, HOST_UIDS)
    leases = iter([squatted])
    fresh = docker_backend.new_lease_id
    monkeypatch.setattr(docker_backend, "new_lease_id", lambda: next(leases, None) or fresh())
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(abstract_name(uid))
    marker = unique("own-uid")
    try:
        result = await run(spec(busybox, f"echo {marker}; id -u"))
    finally:
        squatter.close()
    assert result.ok, result
    assert result.lease != squatted
    assert text(result.stdout).split() == [marker, str(uid_for_lease(result.lease, HOST_UIDS))]
    names = [c.get("Names") for c in witness.containers()]
    assert not any(f"/sbxkit-{squatted}" in (n or []) for n in names)
    assert not (default_state_dir() / (squatted + RECORD_SUFFIX)).exists()


async def test_an_in_process_owner_holds_the_uid_too(
    busybox: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    squatted = secrets.token_hex(16)
    leases = iter([squatted])
    fresh = docker_backend.new_lease_id
    monkeypatch.setattr(docker_backend, "new_lease_id", lambda: next(leases, None) or fresh())
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(abstract_name(uid_for_lease(squatted, HOST_UIDS)))
    owner = InProcessOwner(engine)
    try:
        async with open_sandbox(spec(busybox, "sleep 60"), engine=engine, owner=owner) as box:
            assert box.lease != squatted
            assert held_elsewhere(own_uid(box.user))  # held by this process's owner
    finally:
        squatter.close()
    assert not held_elsewhere(own_uid(box.user))


async def test_a_restarted_supervisor_holds_its_records_uids_again(
    busybox: str,
    engine: Engine,
    supervised: Path,  # noqa: F811 - the fixture, imported above
) -> None:
    """The hold dies with a SIGKILLed supervisor; the one its caller launches again holds the
    uid from the lease record before it serves anyone, and lets it go with the container."""
    owner = SupervisedOwner(engine, state_dir=supervised)
    async with open_sandbox(spec(busybox, "true", timeout_s=60), engine=engine, owner=owner) as box:
        uid = own_uid(box.user)
        assert held_elsewhere(uid)
        await crash(supervised)
        await readopted(supervised, box.lease)  # the caller launched a new one, re-adopted
        assert held_elsewhere(uid)
        ids = await box.exec(["id", "-u"])
        assert text(ids.stdout).split() == [str(uid)]
    await eventually(lambda: not held_elsewhere(uid), 10, f"uid {uid} let go")
