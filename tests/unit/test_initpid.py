"""Finding a started container's init on the host (``sbxkit._kernel.initpid``): the pure pick,
and the lookup through a cgroup layout learned from another container's path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sbxkit._kernel.init import memory_cgroup_of
from sbxkit._kernel.initpid import (
    cgroup_layout_known,
    init_pid_on_host,
    learn_cgroup_layout,
    pick_init,
)

FIRST, SECOND = "a" * 64, "b" * 64


def test_the_init_is_the_one_process_whose_parent_is_outside() -> None:
    assert pick_init([10, 11, 12], {10: 1, 11: 10, 12: 11}) == 10
    assert pick_init([11, 10], {10: 1, 11: 10}) == 10
    assert pick_init([10, 20], {10: 1, 20: 1}) is None  # two roots: not ours to guess
    assert pick_init([], {}) is None


def test_a_learned_layout_finds_another_containers_init(tmp_path: Path) -> None:
    socket = f"/run/test-{os.getpid()}.sock"
    assert init_pid_on_host(socket, "runc", SECOND) is None  # nothing learned: State.Pid answers
    learn_cgroup_layout(socket, "runc", str(tmp_path / "docker" / FIRST), FIRST)
    assert init_pid_on_host(socket, "runc", SECOND) is None  # no such cgroup
    group = tmp_path / "docker" / SECOND
    group.mkdir(parents=True)
    child = subprocess.Popen(["sleep", "30"])
    try:
        (group / "cgroup.procs").write_text(f"{child.pid}\n{os.getpid()}\n")
        assert (
            init_pid_on_host(socket, "runc", SECOND) == os.getpid()
        )  # the child's parent is inside
    finally:
        child.kill()
        child.wait()


def test_a_path_without_the_id_exactly_once_teaches_nothing(tmp_path: Path) -> None:
    socket = f"/run/test-none-{os.getpid()}.sock"
    learn_cgroup_layout(socket, "runc", str(tmp_path / "elsewhere"), FIRST)
    learn_cgroup_layout(socket, "runc", f"/sys/fs/cgroup/memory/{FIRST}/{FIRST}", FIRST)
    learn_cgroup_layout(socket, "runc", None, FIRST)
    assert init_pid_on_host(socket, "runc", SECOND) is None


def test_each_runtime_has_its_own_layout(tmp_path: Path) -> None:
    """On cgroup v2 with the systemd driver crun moves the init into a child of the scope that
    runc leaves it in: a layout learned under one runtime is not used for the other."""
    socket = f"/run/test-runtimes-{os.getpid()}.sock"
    learn_cgroup_layout(socket, "runc", str(tmp_path / f"docker-{FIRST}.scope"), FIRST)
    learn_cgroup_layout(
        socket, "crun", str(tmp_path / f"docker-{FIRST}.scope" / "container"), FIRST
    )
    runc_group = tmp_path / f"docker-{SECOND}.scope"
    crun_group = runc_group / "container"
    crun_group.mkdir(parents=True)
    (runc_group / "cgroup.procs").write_text("")  # a scope whose processes are in its child
    (crun_group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert init_pid_on_host(socket, "crun", SECOND) == os.getpid()
    assert init_pid_on_host(socket, "runc", SECOND) is None  # runc's layout: the empty scope
    assert init_pid_on_host(socket, None, SECOND) is None  # the default's: not learned yet


def test_the_layouts_seen_on_cgroup_v2_are_learned_and_picked(tmp_path: Path) -> None:
    """As the v2 cell showed them (Docker 20.10, systemd driver, kernel 7.2): runc's init and
    shell in the scope, crun's in its ``container`` child with the scope empty; the init is
    docker-init, whose parent (the shim) is outside, the shell its child."""
    runc_line = f"0::/system.slice/docker-{FIRST}.scope\n"
    crun_line = f"0::/system.slice/docker-{FIRST}.scope/container\n"
    runc_dir, crun_dir = memory_cgroup_of(runc_line), memory_cgroup_of(crun_line)
    assert runc_dir == (f"/sys/fs/cgroup/system.slice/docker-{FIRST}.scope", "v2")
    assert crun_dir == (f"/sys/fs/cgroup/system.slice/docker-{FIRST}.scope/container", "v2")
    assert pick_init([1027, 1039], {1027: 1005, 1039: 1027}) == 1027  # runc: init, sh
    assert pick_init([1250, 1253], {1250: 1238, 1253: 1250}) == 1250  # crun: init, sh
    socket = f"/run/test-v2-{os.getpid()}.sock"
    root = str(tmp_path)
    learn_cgroup_layout(socket, "crun", crun_dir[0].replace("/sys/fs/cgroup", root), FIRST)
    learn_cgroup_layout(socket, "runc", runc_dir[0].replace("/sys/fs/cgroup", root), FIRST)
    assert cgroup_layout_known(socket, "crun")
    assert cgroup_layout_known(socket, "runc")
    scope = tmp_path / "system.slice" / f"docker-{SECOND}.scope"
    (scope / "container").mkdir(parents=True)
    (scope / "cgroup.procs").write_text("")
    (scope / "container" / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert init_pid_on_host(socket, "crun", SECOND) == os.getpid()
    assert init_pid_on_host(socket, "runc", SECOND) is None
