"""Which hosts and runs get the kernel's evidence (sbxkit/_kernel/support.py), the supervisor's
rule for the kernel path's bind (recheck.py), and the held pool's template of a kernel path
park (templates.py): pure, no daemon."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from sbxkit._kernel.fifos import io_dir_problem, make_io_dir, stale_io_dirs
from sbxkit._kernel.scripts import IO_TARGET, io_bind, io_root, kernel_io
from sbxkit._kernel.support import HostFacts, daemon_path_reason, run_path_reason
from sbxkit._model.mounts import ExpectedMount, check_target
from sbxkit.engine.models import ContainerCreate, HostConfig
from sbxkit.errors import SpecError
from sbxkit.supervisor.recheck import _check_io_bind
from sbxkit.supervisor.templates import body_for_lease, mounts_for_lease

HOST = HostFacts(exit_info=True, can_chown=True, kernel_release="6.18.44")


def reason(host: HostFacts = HOST, **daemon: object) -> str | None:
    facts: dict[str, object] = {
        "podman": False,
        "daemon_kernel": "6.18.44",
        "operating_system": "Debian GNU/Linux 12 (bookworm)",
        "security_options": ["name=seccomp,profile=default"],
        **daemon,
    }
    return daemon_path_reason(host, **facts)  # type: ignore[arg-type]


def test_a_local_daemon_on_a_new_kernel_gets_the_kernel_path() -> None:
    assert reason() is None


@pytest.mark.parametrize(
    ("host", "daemon", "says"),
    [
        (msgspec.structs.replace(HOST, exit_info=False), {}, "Linux >= 6.15"),
        (HOST, {"podman": True}, "Podman"),
        (HOST, {"daemon_kernel": "5.15.0-docker"}, "remote or VM-backed"),
        (HOST, {"operating_system": "Docker Desktop"}, "VM-backed"),
        (HOST, {"security_options": ["name=userns"]}, "userns"),
        (HOST, {"security_options": ["name=rootless"]}, "rootless"),
        (msgspec.structs.replace(HOST, can_chown=False), {}, "CAP_CHOWN"),
    ],
)
def test_each_host_without_the_kernel_path_says_why(
    host: HostFacts, daemon: dict[str, object], says: str
) -> None:
    said = reason(host, **daemon)
    assert said is not None
    assert says in said


def test_a_run_the_kernel_path_cannot_carry_says_why() -> None:
    assert run_path_reason(runtime="runc", command=["true"], has_shell=None) is None
    assert run_path_reason(runtime="crun", command=["true"], has_shell=True) is None
    assert "runsc" in (run_path_reason(runtime="runsc", command=["true"], has_shell=None) or "")
    assert "option" in (run_path_reason(runtime="runc", command=["-x"], has_shell=None) or "")
    assert "/bin/sh" in (run_path_reason(runtime="runc", command=["x"], has_shell=False) or "")


def test_no_mount_of_a_spec_may_go_where_sbxkit_puts_the_fifos() -> None:
    for target in (IO_TARGET, "/.sbxkit", "/.sbxkit/other"):
        with pytest.raises(SpecError):
            check_target("mounts[0].target", target)


LEASE = "a" * 32


def body_with_io(state_dir: str, lease: str = LEASE) -> ContainerCreate:
    base = ContainerCreate(
        image="busybox", cmd=["true"], user="65534:65534", host_config=HostConfig(binds=[])
    )
    body, _ = kernel_io(base, str(io_root(Path(state_dir)) / lease), {})
    return body


def test_the_supervisor_takes_only_the_leases_own_fifo_directory(tmp_path: Path) -> None:
    state_dir = tmp_path / "leases"
    body = body_with_io(str(state_dir))
    uid, gid = os.geteuid(), os.getegid()
    body = msgspec.structs.replace(body, user=f"{uid or 1}:{gid or 1}")
    ok = _check_io_bind(body.host_config.binds or [], body, LEASE, str(state_dir), None)  # type: ignore[union-attr]
    assert ok == []  # the FIFO bind is judged by its own rule, not as an ordinary bind
    other = msgspec.structs.replace(
        body,
        host_config=HostConfig(binds=[io_bind(str(io_root(state_dir) / ("b" * 32)))]),
    )
    with pytest.raises(Exception, match="the FIFO bind must be"):
        _check_io_bind(other.host_config.binds or [], other, LEASE, str(state_dir), None)  # type: ignore[union-attr]
    writable = msgspec.structs.replace(
        body,
        host_config=HostConfig(binds=[f"{io_root(state_dir) / LEASE}:{IO_TARGET}:rw,rprivate"]),
    )
    with pytest.raises(Exception, match="the FIFO bind must be"):
        _check_io_bind(writable.host_config.binds or [], writable, LEASE, str(state_dir), None)  # type: ignore[union-attr]


def test_the_fifo_directory_must_hold_its_three_fifos_and_nothing_else(tmp_path: Path) -> None:
    uid, gid = os.geteuid(), os.getegid()
    leaf = make_io_dir(tmp_path / "root", LEASE, uid, gid)
    assert io_dir_problem(str(leaf), uid, gid) is None
    (leaf / "extra").write_text("x")
    assert "more or less" in (io_dir_problem(str(leaf), uid, gid) or "")
    os.unlink(leaf / "extra")
    os.unlink(leaf / "out")
    (leaf / "out").write_text("a file, not a FIFO")
    assert "not a FIFO" in (io_dir_problem(str(leaf), uid, gid) or "")
    assert "not a directory of the sandbox user" in (io_dir_problem(str(leaf), uid + 1, gid) or "")


def test_a_kernel_path_template_is_one_shape_whatever_lease_it_was_made_under() -> None:
    state_dir = "/var/lib/sbxkit/leases"
    template = body_with_io(state_dir, LEASE)
    parked = body_for_lease(template, LEASE, "c" * 32)
    assert parked == body_with_io(state_dir, "c" * 32)
    mounts = [
        ExpectedMount(
            type="bind", source=f"{state_dir}.io/{LEASE}", destination=IO_TARGET, rw=False
        )
    ]
    assert mounts_for_lease(mounts, LEASE, "c" * 32)[0].source == f"{state_dir}.io/{'c' * 32}"


def test_stale_io_dirs_are_the_directories_older_than_the_bound(tmp_path: Path) -> None:
    root = tmp_path / "leases.io"
    assert stale_io_dirs(root, older_than_s=60, now=time.time()) == []  # no root yet
    root.mkdir()
    now = time.time()
    for name, age in (("old", 120.0), ("new", 10.0), ("edge", 60.0)):
        (root / name).mkdir()
        os.utime(root / name, (now - age, now - age))
    (root / "a-file").write_text("")  # not a lease directory
    os.utime(root / "a-file", (now - 999, now - 999))
    (root / "a-link").symlink_to(root / "old")  # not followed
    assert stale_io_dirs(root, older_than_s=60, now=now) == ["old"]
    assert stale_io_dirs(root, older_than_s=5, now=now) == ["edge", "new", "old"]


def test_the_daemon_holds_no_stdin_for_a_kernel_path_sandbox(tmp_path: Path) -> None:
    # The FIFOs carry the stdio and nothing attaches: a stdin pipe per container, held open by
    # the daemon, would only cost its create and start.
    base = ContainerCreate(
        image="busybox",
        cmd=["true"],
        attach_stdin=True,
        attach_stdout=True,
        attach_stderr=True,
        open_stdin=True,
        stdin_once=True,
        host_config=HostConfig(binds=[]),
    )
    body, _ = kernel_io(base, str(io_root(tmp_path / "leases") / LEASE), {})
    assert (body.open_stdin, body.stdin_once) == (False, False)
    assert (body.attach_stdin, body.attach_stdout, body.attach_stderr) == (False, False, False)
    wire = msgspec.json.decode(msgspec.json.encode(body))
    assert (wire["OpenStdin"], wire["AttachStdin"]) == (False, False)
