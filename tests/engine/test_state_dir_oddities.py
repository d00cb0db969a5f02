"""State directory oddities block execution with the path and the problem, at once.

Each oddity is made on disk by hand, then met two ways: by a real run through the client (which
must fail with an error naming the path and the problem, without launching a supervisor that
would time out), and by a real supervisor process started on it (which must refuse to start or
block execution with the same words in its log or on the wire, never a traceback). A permission
change while a supervisor runs is noticed at the next admission. Nothing is ever created
(the autouse witness fixture), and a fixed directory works again (the positive control).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._plan.plan import new_lease_id
from sbxkit._protocol.journal import check_state_dir
from sbxkit._protocol.records import LeaseRecord, encode_record
from sbxkit._protocol.statedir import MAX_SOCKET_PATH
from sbxkit._protocol.wire import Refused, Welcome
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError
from tests.engine.helpers import spec
from tests.engine.test_supervisor import RawClient, hello, register_for, supervisor_pids
from tests.supervision import (
    running_supervisor,
    supervisor_command,
)
from tests.witness import SOCKET


def odd_temp_dir(state_dir: Path) -> tuple[Path, str]:
    check_state_dir(state_dir, create=True)
    odd = state_dir / ".tmp-dir"
    odd.mkdir()
    return odd, "named like a journal temp file"


def symlinked_lock(state_dir: Path) -> tuple[Path, str]:
    check_state_dir(state_dir, create=True)
    target = state_dir.parent / "elsewhere"
    target.write_text("")
    (state_dir / "supervisor.lock").symlink_to(target)
    return state_dir / "supervisor.lock", "symbolic link"


def symlinked_log(state_dir: Path) -> tuple[Path, str]:
    check_state_dir(state_dir, create=True)
    (state_dir / "supervisor.log").symlink_to(state_dir.parent / "elsewhere.log")
    return state_dir / "supervisor.log", "symbolic link"


def too_long(state_dir: Path) -> tuple[Path, str]:
    deep = state_dir.parent / ("d" * (MAX_SOCKET_PATH - len(str(state_dir.parent)))) / "leases"
    os.mkdir(deep.parent, 0o700)
    os.mkdir(deep, 0o700)
    return deep, "too long for a Unix socket"


def parent_symlink(state_dir: Path) -> tuple[Path, str]:
    real = state_dir.parent / "real"
    real.mkdir(mode=0o700)
    link = state_dir.parent / "link"
    link.symlink_to(real)
    os.mkdir(real / "leases", 0o700)
    return link / "leases", "symbolic link"


def group_writable_parent(state_dir: Path) -> tuple[Path, str]:
    check_state_dir(state_dir, create=True)
    os.chmod(state_dir.parent, 0o770)
    return state_dir, "other users can replace"


def open_mode(state_dir: Path) -> tuple[Path, str]:
    check_state_dir(state_dir, create=True)
    os.chmod(state_dir, 0o755)
    return state_dir, "has mode 0755"


ODDITIES = {
    "temp-named-directory": odd_temp_dir,
    "symlinked-lock": symlinked_lock,
    "symlinked-log": symlinked_log,
    "path-too-long": too_long,
    "symlink-above": parent_symlink,
    "writable-parent": group_writable_parent,
    "mode-0755": open_mode,
}


def where(state_dir: Path, odd: Path) -> Path:
    """The state dir an oddity is about (the deep one for a too-long path)."""
    if odd.name == "leases":
        return odd
    return odd.parent if odd.parent.name == "leases" else state_dir


@pytest.mark.parametrize("name", sorted(ODDITIES))
async def test_a_run_reports_the_oddity_by_path_and_launches_nothing(
    name: str, engine: Engine, busybox: str, state_dir: Path
) -> None:
    odd, problem = ODDITIES[name](state_dir)
    directory = where(state_dir, odd)
    owner = SupervisedOwner(engine, state_dir=directory)

    with pytest.raises(SbxError) as caught:
        await run(spec(busybox, "true"), engine=engine, owner=owner)

    message = str(caught.value)
    reported = odd if name != "symlink-above" else odd.parent.parent / "link"
    if name == "writable-parent":
        reported = state_dir.parent
    assert str(reported) in message, message
    assert problem in message, message
    assert "see " not in message  # not the launch timeout's "see supervisor.log"
    assert supervisor_pids(directory) == []  # nothing was launched to time out


@pytest.mark.parametrize("name", ["symlinked-lock", "path-too-long"])
def test_a_supervisor_started_on_it_refuses_to_start_naming_it(name: str, state_dir: Path) -> None:
    odd, problem = ODDITIES[name](state_dir)
    directory = where(state_dir, odd)
    done = subprocess.run(
        supervisor_command(directory),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done
    assert "refusing to start:" in done.stderr
    assert str(odd) in done.stderr
    assert problem in done.stderr
    assert "Traceback" not in done.stderr


def test_an_odd_entry_blocks_a_running_supervisor_by_path(busybox: str, state_dir: Path) -> None:
    odd, problem = odd_temp_dir(state_dir)
    with running_supervisor(state_dir, "--engine-socket", SOCKET) as sup:
        client = RawClient(sup.socket_path)
        try:
            client.send(hello())
            assert isinstance(client.receive(), Welcome)
            client.send(register_for(new_lease_id(), busybox, "true", SOCKET))
            reply = client.receive()
        finally:
            client.close()
        assert isinstance(reply, Refused), reply
        assert reply.code == "storage"
        assert str(odd) in reply.reason
        assert problem in reply.reason
        assert "Traceback" not in sup.log()


async def test_a_chmod_while_running_is_noticed_before_the_next_admission(
    engine: Engine, busybox: str, state_dir: Path
) -> None:
    with running_supervisor(state_dir, "--engine-socket", SOCKET):
        owner = SupervisedOwner(engine, state_dir=state_dir)
        first = await run(spec(busybox, "echo one"), engine=engine, owner=owner)
        assert first.stdout == b"one\n"  # the positive control

        os.chmod(state_dir, 0o755)
        with pytest.raises(SbxError) as caught:
            await run(spec(busybox, "echo two"), engine=engine, owner=owner)
        assert str(state_dir) in str(caught.value)
        assert "has mode 0755" in str(caught.value)

        os.chmod(state_dir, 0o700)  # fixed: execution resumes without a restart
        third = await run(spec(busybox, "echo three"), engine=engine, owner=owner)
        assert third.stdout == b"three\n"
    await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("oddity", ["foreign-file", "malformed-record", "unknown-record"])
async def test_an_entry_added_while_running_blocks_the_next_admission_until_removed(
    engine: Engine, busybox: str, state_dir: Path, oddity: str
) -> None:
    """Issue 27.9: the directory is audited at every admission, not only at start."""
    with running_supervisor(state_dir, "--engine-socket", SOCKET, "--persistent"):
        owner = SupervisedOwner(engine, state_dir=state_dir)
        first = await run(spec(busybox, "echo one"), engine=engine, owner=owner)
        assert first.stdout == b"one\n"  # the positive control

        lease = new_lease_id()
        odd = state_dir / ("notes.txt" if oddity == "foreign-file" else f"{lease}.lease")
        content = "not a record" if oddity != "unknown-record" else unknown_record(lease)
        odd.write_text(content)
        os.chmod(odd, 0o600)
        with pytest.raises(SbxError) as caught:
            await run(spec(busybox, "echo two"), engine=engine, owner=owner)
        assert str(odd) in str(caught.value)

        odd.unlink()  # removed: execution resumes without a restart
        third = await run(spec(busybox, "echo three"), engine=engine, owner=owner)
        assert third.stdout == b"three\n"
    await trio.lowlevel.checkpoint()


def unknown_record(lease: str) -> str:
    """A well-formed record of a lease no running supervisor wrote."""
    record = LeaseRecord(
        lease=lease,
        name=f"sbxkit-{lease}",
        state="creating",
        engine_socket=SOCKET,
        registered_at=time.time(),
        lifetime_deadline=time.time() + 60,
        memory_bytes=64 * 1024 * 1024,
        nano_cpus=10**9,
    )
    return encode_record(record).decode()


async def test_an_oddity_found_at_start_stops_blocking_once_removed(
    engine: Engine, busybox: str, state_dir: Path
) -> None:
    """Issue 27.9: the start's verdict was kept until the supervisor exited."""
    odd, problem = odd_temp_dir(state_dir)
    with running_supervisor(state_dir, "--engine-socket", SOCKET, "--persistent"):
        owner = SupervisedOwner(engine, state_dir=state_dir)
        with pytest.raises(SbxError) as caught:
            await run(spec(busybox, "echo one"), engine=engine, owner=owner)
        assert str(odd) in str(caught.value)
        assert problem in str(caught.value)

        odd.rmdir()
        after = await run(spec(busybox, "echo two"), engine=engine, owner=owner)
        assert after.stdout == b"two\n"
    await trio.lowlevel.checkpoint()


def test_the_client_reads_a_startup_refusal_instead_of_waiting(
    state_dir: Path, tmp_path: Path
) -> None:
    """A refusal only the supervisor can see (here: a launcher that always refuses) comes back
    as its own words from the log, not after the launch timeout."""
    check_state_dir(state_dir, create=True)
    fake = tmp_path / "refuser.sh"
    fake.write_text(
        "#!/bin/sh\necho 'sbxkit-supervisor[1]: refusing to start: /x/y: it says why' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    code = (
        "import trio, sys\n"
        "from pathlib import Path\n"
        "from sbxkit._lifecycle.connect import connect_supervisor\n"
        f"state, command = Path({str(state_dir)!r}), {str(fake)!r}\n"
        "try:\n"
        "    trio.run(lambda: connect_supervisor(state, command=command))\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "refused to start: /x/y: it says why" in done.stdout, done
