"""Pure: the runtime a sandbox runs under when its spec names none (``plan_runtime``), and
crun's fsize floor, refused by name before the daemon is contacted."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from sbxkit._model.gpu import GpuCursor
from sbxkit._model.mounts import ResolvedMounts
from sbxkit._model.runtimes import CRUN_MIN_FSIZE, check_crun_fsize, check_runtime_fit, plan_runtime
from sbxkit._model.spec import Limits, MiB, SandboxSpec, validate_spec
from sbxkit._plan.plan import DaemonFacts, build_plan, check_spec, new_lease_id
from sbxkit._plan.preflight import DaemonPlan, check_daemon
from sbxkit.engine.models import InfoReply
from sbxkit.errors import SpecError

DOCKER_RUNTIMES = ("crun", "io.containerd.runc.v2", "runc", "runsc")
"""What the main test daemon's ``/info`` registers."""


def _plan(runtime: str | None = None, **facts: Any) -> str | None:
    given: dict[str, Any] = {
        "podman": False,
        "default_runtime": "runc",
        "registered": DOCKER_RUNTIMES,
        "fsize_bytes": 64 * MiB,
    }
    given.update(facts)
    return plan_runtime(runtime, **given)


def test_no_runtime_on_a_runc_default_docker_that_registers_crun_is_crun() -> None:
    assert _plan() == "crun"
    assert _plan(fsize_bytes=CRUN_MIN_FSIZE) == "crun"  # the floor itself is crun's


def test_an_fsize_under_crun_s_floor_falls_back_to_runc_by_name() -> None:
    # named, so the post-create inspection verifies HostConfig.Runtime is runc
    assert _plan(fsize_bytes=CRUN_MIN_FSIZE - 1) == "runc"
    assert _plan(fsize_bytes=99) == "runc"


def test_another_default_is_the_operator_s_and_is_kept() -> None:
    # a daemon whose default is runsc keeps it: isolation is never weakened silently
    assert _plan(default_runtime="runsc") is None
    assert _plan(default_runtime="crun") is None
    assert _plan(default_runtime="") is None  # a daemon that does not say


def test_a_daemon_without_crun_keeps_its_default() -> None:
    assert _plan(registered=("runc", "runsc")) is None
    assert _plan(registered=()) is None


def test_podman_keeps_its_service_default() -> None:
    # its compat API ignores HostConfig.Runtime: naming crun would be a word, not a choice
    assert _plan(podman=True) is None
    assert _plan(podman=True, default_runtime="crun") is None


def test_gpus_keep_the_daemon_default() -> None:
    assert _plan(gpus=True) is None


def test_a_remapping_daemon_keeps_its_default() -> None:
    # userns-remap or rootless: crun failed execs right after a start there under load
    assert _plan(remapped=True) is None
    assert _plan("crun", remapped=True) == "crun"  # named: the caller's choice


@pytest.mark.parametrize(("asked", "name"), [("runc", "runc"), ("gvisor", "runsc")])
def test_a_named_runtime_is_taken_as_named(asked: str, name: str) -> None:
    assert _plan(asked) == name
    assert _plan(asked, fsize_bytes=99) == name  # runc's and runsc's fsize has no floor
    assert _plan(asked, default_runtime="runsc") == name


def test_explicit_crun_is_taken_at_or_over_its_floor() -> None:
    assert _plan("crun") == "crun"
    assert _plan("crun", fsize_bytes=CRUN_MIN_FSIZE) == "crun"


def test_explicit_crun_under_its_floor_is_refused_naming_the_field_value_and_rule() -> None:
    with pytest.raises(SpecError) as caught:
        _plan("crun", fsize_bytes=4096)
    assert caught.value.field == "limits.fsize_bytes"
    assert "4096" in caught.value.rule
    assert f"crun's floor of {CRUN_MIN_FSIZE} bytes" in caught.value.rule
    assert "runtime='runc'" in caught.value.rule


def test_a_named_runtime_the_daemon_lacks_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        _plan("kata")
    assert caught.value.field == "runtime"
    assert "not registered" in caught.value.rule
    with pytest.raises(SpecError):
        _plan("crun", registered=("runc",))


def test_validate_spec_refuses_explicit_crun_under_the_floor_before_the_daemon() -> None:
    def spec(runtime: str | None, fsize: int) -> SandboxSpec:
        limits = Limits(
            cpus=1, memory_bytes=64 * MiB, pids=8, output_bytes=MiB, timeout_s=5, fsize_bytes=fsize
        )
        return SandboxSpec(image="img", command=["true"], limits=limits, runtime=runtime)

    with pytest.raises(SpecError) as caught:
        validate_spec(spec("crun", CRUN_MIN_FSIZE - 1))
    assert caught.value.field == "limits.fsize_bytes"
    validate_spec(spec("crun", CRUN_MIN_FSIZE))
    for runtime in (None, "runc"):  # no runtime named: the plan falls back, nothing refused
        validate_spec(spec(runtime, 99))


def test_the_fsize_check_concerns_crun_only() -> None:
    for runtime in (None, "runc", "runsc", "crun-debug"):
        check_crun_fsize(runtime, 1)
        check_runtime_fit(runtime, "none", 256, 1)
    check_crun_fsize("crun", None)
    with pytest.raises(SpecError):
        check_runtime_fit("crun", "none", 1, 1)


def test_the_floor_holds_the_largest_seccomp_filter_the_kernel_takes() -> None:
    # BPF_MAXINSNS (4096) instructions of 8 bytes: any profile crun compiles fits under it
    assert CRUN_MIN_FSIZE == 4096 * 8


@pytest.mark.parametrize("planned", ["crun", "runc", None])
def test_the_plan_carries_the_planned_runtime_into_the_body_it_verifies(
    planned: str | None,
) -> None:
    """``build_plan`` puts the daemon plan's runtime in the body (and the spec as it runs), so
    the post-create inspection (``check_created``) compares ``HostConfig.Runtime`` to it."""
    limits = Limits(cpus=1, memory_bytes=64 * MiB, pids=8, output_bytes=MiB, timeout_s=5)
    checked = check_spec(SandboxSpec(image="img", command=["true"], limits=limits))
    facts = DaemonFacts(mounts=ResolvedMounts(), daemon=DaemonPlan(runtime=planned))
    plan = build_plan(checked, facts, lease=new_lease_id())
    assert plan.body.host_config.runtime == planned
    assert plan.spec.runtime == planned
    assert checked.spec.runtime is None  # the caller's spec is never changed


class _Daemon:
    """Answers ``/info`` as the main test daemon does (runc default, crun registered) and
    counts the calls."""

    is_podman = False

    def __init__(self, default_runtime: str = "runc", security: tuple[str, ...] = ()) -> None:
        runtimes = {name: {"path": name} for name in DOCKER_RUNTIMES}
        doc = {
            "DefaultRuntime": default_runtime,
            "Runtimes": runtimes,
            "SecurityOptions": ["name=seccomp,profile=default", *security],
        }
        self.reply = msgspec.json.decode(msgspec.json.encode(doc), type=InfoReply)
        self.calls = 0
        self.socket_path = f"/stub/{uuid.uuid4().hex}.sock"  # preflight keeps facts per socket

    async def cached_info(self) -> InfoReply:
        self.calls += 1
        return self.reply


async def test_the_shell_plans_the_default_from_one_info_a_minute() -> None:
    daemon = _Daemon()
    limits = Limits(cpus=1, memory_bytes=64 * MiB, pids=8, output_bytes=MiB, timeout_s=5)
    small = msgspec.structs.replace(limits, fsize_bytes=99)

    def spec(runtime: str | None = None, bounds: Limits = limits) -> SandboxSpec:
        return SandboxSpec(image="img", command=["true"], limits=bounds, runtime=runtime)

    plans = [
        await check_daemon(daemon, asked, GpuCursor())  # type: ignore[arg-type]
        for asked in (spec(), spec(bounds=small), spec("runc"))
    ]
    assert [plan.runtime for plan in plans] == ["crun", "runc", "runc"]
    assert daemon.calls == 1  # the one-shot path's hot loop does not ask again
    plan = await check_daemon(_Daemon("runsc"), spec(), GpuCursor())  # type: ignore[arg-type]
    assert plan.runtime is None  # the operator's runsc is kept


async def test_the_shell_reads_a_remapping_daemon_from_its_security_options() -> None:
    limits = Limits(cpus=1, memory_bytes=64 * MiB, pids=8, output_bytes=MiB, timeout_s=5)
    asked = SandboxSpec(image="img", command=["true"], limits=limits)
    remapped = _Daemon(security=("name=userns",))
    plan = await check_daemon(remapped, asked, GpuCursor())  # type: ignore[arg-type]
    assert plan.runtime is None  # the daemon's runc, as on the old default
    plain = await check_daemon(_Daemon(), asked, GpuCursor())  # type: ignore[arg-type]
    assert plain.runtime == "crun"  # the control: the same daemon without the remap
