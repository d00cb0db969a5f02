"""Finding a started container's init on the host (``sbxkit._kernel.initpid``): the pure pick,
and the lookup through a cgroup layout learned from another container's path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sbxkit._kernel.initpid import init_pid_on_host, learn_cgroup_layout, pick_init

FIRST, SECOND = "a" * 64, "b" * 64


def test_the_init_is_the_one_process_whose_parent_is_outside() -> None:
    assert pick_init([10, 11, 12], {10: 1, 11: 10, 12: 11}) == 10
    assert pick_init([11, 10], {10: 1, 11: 10}) == 10
    assert pick_init([10, 20], {10: 1, 20: 1}) is None  # two roots: not ours to guess
    assert pick_init([], {}) is None


def test_a_learned_layout_finds_another_containers_init(tmp_path: Path) -> None:
    socket = f"/run/test-{os.getpid()}.sock"
    assert init_pid_on_host(socket, SECOND) is None  # nothing learned: State.Pid answers
    learn_cgroup_layout(socket, str(tmp_path / "docker" / FIRST), FIRST)
    assert init_pid_on_host(socket, SECOND) is None  # no such cgroup
    group = tmp_path / "docker" / SECOND
    group.mkdir(parents=True)
    child = subprocess.Popen(["sleep", "30"])
    try:
        (group / "cgroup.procs").write_text(f"{child.pid}\n{os.getpid()}\n")
        assert init_pid_on_host(socket, SECOND) == os.getpid()  # the child's parent is inside
    finally:
        child.kill()
        child.wait()


def test_a_path_without_the_id_exactly_once_teaches_nothing(tmp_path: Path) -> None:
    socket = f"/run/test-none-{os.getpid()}.sock"
    learn_cgroup_layout(socket, str(tmp_path / "elsewhere"), FIRST)
    learn_cgroup_layout(socket, f"/sys/fs/cgroup/memory/{FIRST}/{FIRST}", FIRST)
    learn_cgroup_layout(socket, None, FIRST)
    assert init_pid_on_host(socket, SECOND) is None
