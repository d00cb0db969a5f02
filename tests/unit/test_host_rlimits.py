"""Rlimits the host sets for an engine that drops them (rootless Podman): the pure parts — how
``/proc/PID/limits`` reads, when a process's limits are the plan's, when the post-create check
accepts a body without its ulimits — and ``enforce_rlimits`` on real processes of this host
(a child of the test, in the test's own cgroup). The engine itself is proven in the cgroup v2
cell (``tests/engine/test_podman.py``, ``SBXKIT_CGROUP2_ENGINES=rootless-podman``)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sbxkit._kernel.rlimits import (
    UNLIMITED,
    RlimitsUnenforced,
    enforce_rlimits,
    limits_problem,
    parse_limits,
)
from sbxkit._plan.verify import ulimits_problem
from sbxkit.backends.docker import HOST_RLIMITS_GATED
from sbxkit.errors import SpecError
from sbxkit.network.gate import gate_command

LIMITS = """\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max file size             1048576              1048576              bytes
Max processes             32768                32768                processes
Max open files            1024                 4096                 files
Max msgqueue size         0                    0                    bytes
Max nice priority         0                    0
Max realtime timeout      unlimited            unlimited            us
"""
PLAN = [("fsize", 1048576, 1048576), ("msgqueue", 0, 0), ("nofile", 1024, 4096)]
ROOTLESS_INSIDE = LIMITS.replace("1048576              1048576", "unlimited            unlimited")


def test_proc_limits_parse_by_label_with_unlimited() -> None:
    parsed = parse_limits(LIMITS)
    assert parsed["Max file size"] == (1048576, 1048576)
    assert parsed["Max open files"] == (1024, 4096)
    assert parsed["Max cpu time"] == (UNLIMITED, UNLIMITED)
    assert parsed["Max nice priority"] == (0, 0)  # no unit column
    assert parsed["Max realtime timeout"] == (UNLIMITED, UNLIMITED)
    assert "Limit" not in parsed  # the header


def test_this_hosts_own_proc_limits_parse() -> None:
    """The kernel's text (padded columns, trailing blanks) against ``resource``'s word."""
    with open("/proc/self/limits", encoding="ascii") as file:
        parsed = parse_limits(file.read())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert parsed["Max open files"] == (soft, hard)
    assert len(parsed) == 16


def test_the_plans_limits_are_accepted_exactly() -> None:
    assert limits_problem(7, parse_limits(LIMITS), PLAN) is None


def test_what_rootless_podman_leaves_is_named() -> None:
    problem = limits_problem(7, parse_limits(ROOTLESS_INSIDE), PLAN)
    assert problem == "pid 7: Max file size is -1/-1, expected 1048576/1048576 (soft/hard)"


def test_a_soft_limit_below_the_plans_is_not_the_plans() -> None:
    lowered = LIMITS.replace("1024                 4096", "512                  4096")
    assert "Max open files is 512/4096" in (limits_problem(1, parse_limits(lowered), PLAN) or "")


def test_a_limit_proc_does_not_show_is_a_problem() -> None:
    assert "not shown" in (limits_problem(1, parse_limits(LIMITS), [("core", 0, 0)]) or "")


ASKED = [("fsize", 1, 1), ("msgqueue", 0, 0), ("nofile", 1024, 4096)]
PODMAN_SAME = [("RLIMIT_FSIZE", 1, 1), ("RLIMIT_MSGQUEUE", 0, 0), ("RLIMIT_NOFILE", 1024, 4096)]


def test_the_ulimits_asked_for_pass_in_either_dialect() -> None:
    assert ulimits_problem(ASKED, ASKED, podman=False, rlimits_by_host=False) is None
    assert ulimits_problem(ASKED, PODMAN_SAME, podman=True, rlimits_by_host=False) is None


def test_a_body_without_its_ulimits_passes_only_when_the_host_sets_them() -> None:
    refused = ulimits_problem(ASKED, [], podman=True, rlimits_by_host=False)
    assert refused is not None
    assert refused.startswith("HostConfig.Ulimits are []")
    assert ulimits_problem(ASKED, [], podman=True, rlimits_by_host=True) is None
    # Only Podman's drop: a Docker daemon that loses them is still refused.
    assert ulimits_problem(ASKED, [], podman=False, rlimits_by_host=True) is not None


def test_other_ulimits_than_asked_are_refused_even_when_the_host_sets_them() -> None:
    other = [("RLIMIT_FSIZE", 2, 2), *PODMAN_SAME[1:]]
    assert ulimits_problem(ASKED, other, podman=True, rlimits_by_host=True) is not None


# --- on real processes of this host -------------------------------------------------------

CHILD = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
    "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)\n"
)


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    """A process with a child of its own, both sleeping (a gated shell's shape)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def own_cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as file:
        return file.read().splitlines()[-1].split(":", 2)[2]


def limits_of(pid: int) -> dict[str, tuple[int, int]]:
    with open(f"/proc/{pid}/limits", encoding="ascii") as file:
        return parse_limits(file.read())


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as file:
        return [int(word) for word in file.read().split()]


def test_enforce_sets_and_proves_them_on_the_init_and_its_descendants(
    tree: subprocess.Popen[str],
) -> None:
    (child,) = children_of(tree.pid)
    assert limits_of(child)["Max file size"] != (4096, 4096)

    count = enforce_rlimits(tree.pid, own_cgroup(tree.pid), [("fsize", 4096, 4096)])

    assert count == 2
    assert limits_of(tree.pid)["Max file size"] == (4096, 4096)
    assert limits_of(child)["Max file size"] == (4096, 4096)


def test_enforce_refuses_a_process_outside_the_containers_cgroup(
    tree: subprocess.Popen[str],
) -> None:
    with pytest.raises(RlimitsUnenforced, match="not in the container's cgroup"):
        enforce_rlimits(tree.pid, "no-such-container-id", [("fsize", 4096, 4096)])
    assert limits_of(tree.pid)["Max file size"] != (4096, 4096)  # nothing touched


def test_enforce_refuses_a_gone_init() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(RlimitsUnenforced, match=f"the init pid {proc.pid}"):
        enforce_rlimits(proc.pid, "x", [("fsize", 1, 1)])


def test_enforce_names_a_ulimit_it_cannot_set() -> None:
    with pytest.raises(RlimitsUnenforced, match="rttime"):
        enforce_rlimits(os.getpid(), "x", [("rttime", 1, 1)])


def test_a_command_the_gate_cannot_exec_is_refused_saying_why_it_is_gated() -> None:
    with pytest.raises(SpecError) as refused:
        gate_command(["-x"], HOST_RLIMITS_GATED)
    assert refused.value.field == "command[0]"
    assert refused.value.rule.startswith("on rootless Podman the command starts once the host")
    assert "leading '-'" in refused.value.rule
    assert gate_command(["echo", "hi"], HOST_RLIMITS_GATED)[:2] == ["sh", "-c"]
