"""State directory verdicts (pure, over stat facts) and the supervisor's launch environment."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sbxkit._lifecycle.launch_environment import SUPERVISOR_ENVIRONMENT, supervisor_environment
from sbxkit._protocol.journal import check_state_dir
from sbxkit._protocol.statedir import (
    MAX_SOCKET_PATH,
    ancestor_problem,
    entry_problem,
    socket_path_problem,
    startup_refusal,
)
from sbxkit.errors import StorageError

EUID = 1000


def facts(kind: int, mode: int = 0o600, uid: int = EUID, nlink: int = 1) -> os.stat_result:
    return os.stat_result((kind | mode, 0, 0, nlink, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("name", "info", "verdict"),
    [
        ("supervisor.lock", facts(stat.S_IFREG), None),
        ("supervisor.log", facts(stat.S_IFREG), None),
        ("supervisor.sock", facts(stat.S_IFSOCK), None),
        ("a" * 32 + ".lease", facts(stat.S_IFLNK), None),  # judged when read
        (".tmp-" + "a" * 32 + "-0a0b", facts(stat.S_IFREG), "stale"),
        (".tmp-dir", facts(stat.S_IFDIR, 0o700), "is a directory named like a journal temp"),
        (".tmp-x", facts(stat.S_IFLNK), "is a symbolic link named like"),
        (".tmp-x", facts(stat.S_IFREG, uid=0), "owned by uid 0"),
        ("supervisor.lock", facts(stat.S_IFLNK), "is a symbolic link; the supervisor's"),
        ("supervisor.lock", facts(stat.S_IFDIR), "is a directory; the supervisor's"),
        ("supervisor.log", facts(stat.S_IFREG, nlink=2), "has 2 links"),
        ("supervisor.sock", facts(stat.S_IFREG), "is a regular file; the supervisor's"),
        ("supervisor.log", facts(stat.S_IFREG, uid=7), "owned by uid 7"),
        ("notes.txt", facts(stat.S_IFREG), "did not write"),
        ("fifo", facts(stat.S_IFIFO), "is a FIFO the supervisor did not write"),
    ],
)
def test_each_entry_gets_its_verdict(name: str, info: os.stat_result, verdict: str | None) -> None:
    found = entry_problem(name, info, EUID)
    if verdict is None or verdict == "stale":
        assert found == verdict
    else:
        assert found is not None
        assert verdict in found


@pytest.mark.parametrize(
    ("info", "problem"),
    [
        (facts(stat.S_IFDIR, 0o755, uid=0), None),
        (facts(stat.S_IFDIR, 0o700), None),
        (facts(stat.S_IFDIR, 0o1777, uid=0), None),  # /tmp: sticky
        (facts(stat.S_IFLNK, 0o777), "symbolic link"),
        (facts(stat.S_IFREG, 0o755), "not a directory"),
        (facts(stat.S_IFDIR, 0o755, uid=7), "owned by uid 7"),
        (facts(stat.S_IFDIR, 0o775), "mode 0775"),
        (facts(stat.S_IFDIR, 0o757), "mode 0757"),
    ],
)
def test_each_ancestor_gets_its_verdict(info: os.stat_result, problem: str | None) -> None:
    found = ancestor_problem(info, EUID)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_the_socket_path_limit_is_the_kernels() -> None:
    fits = Path("/" + "d" * (MAX_SOCKET_PATH - len("/supervisor.sock") - 1))
    assert socket_path_problem(fits) is None
    longer = Path(str(fits) + "d")
    problem = socket_path_problem(longer)
    assert problem is not None
    assert f"{MAX_SOCKET_PATH + 1}-byte" in problem


def test_a_symlink_above_the_state_dir_is_refused_naming_it(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(StorageError) as caught:
        check_state_dir(tmp_path / "link" / "leases", create=True)
    assert caught.value.path == str(tmp_path / "link")
    assert "symbolic link" in caught.value.problem


def test_create_makes_missing_ancestors_private_even_under_a_permissive_umask(
    tmp_path: Path,
) -> None:
    old = os.umask(0)
    try:
        check_state_dir(tmp_path / "a" / "b" / "leases", create=True)
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "leases"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


def test_a_startup_refusal_is_found_in_the_log_tail() -> None:
    tail = (
        b"2026-12-01T10:00:00 sbxkit-supervisor[7]: listening\n"
        b"2026-12-01T10:00:01 sbxkit-supervisor[8]: refusing to start: /s/supervisor.lock: "
        b"cannot be opened: Too many levels of symbolic links\n"
    )
    assert startup_refusal(tail) == (
        "/s/supervisor.lock: cannot be opened: Too many levels of symbolic links"
    )
    assert startup_refusal(b"listening on /s/supervisor.sock\n") is None


def test_the_launch_environment_keeps_only_the_documented_names() -> None:
    caller = {
        b"PATH": b"/usr/bin:/bin",
        b"OPENAI_API_KEY": b"sk-secret",
        b"HOME": b"/root",
        b"DOCKER_HOST": b"unix:///x.sock",
        b"SBXKIT_ENV": b"\xffprod",
        b"LANG": b"C.UTF-8",
        b"SBXKIT_STATE_DIR": b"/s",
    }
    assert supervisor_environment(caller) == {
        b"PATH": b"/usr/bin:/bin",
        b"SBXKIT_ENV": b"\xffprod",
        b"LANG": b"C.UTF-8",
    }
    assert set(SUPERVISOR_ENVIRONMENT) == {
        "PATH",
        "PYTHONPATH",
        "SBXKIT_ENV",
        "SBXKIT_HOST_SLOWNESS",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
    }


def test_a_launch_names_the_callers_engine_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    from sbxkit._lifecycle.launch import launch_engine_sockets, supervisor_argv
    from sbxkit._protocol.wire import Recover

    monkeypatch.setenv("DOCKER_HOST", "unix:///run/mine.sock")
    assert launch_engine_sockets(Recover()) == ["/run/mine.sock"]  # an operator's request
    argv = supervisor_argv(Path("/s"), "sup", engine_sockets=["/a.sock", "/b.sock"])
    assert argv == [
        "sup",
        "--state-dir",
        "/s",
        "--engine-socket",
        "/a.sock",
        "--engine-socket",
        "/b.sock",
    ]
    monkeypatch.setenv("DOCKER_HOST", "tcp://1.2.3.4:2375")
    assert launch_engine_sockets(None) == []
