"""Pure: what sbxkit refuses by name per OCI runtime, before the daemon is contacted."""

from __future__ import annotations

import pytest

from sbxkit._model.runtimes import GVISOR_MIN_PIDS, check_runtime_fit
from sbxkit._model.spec import Limits, MiB, SandboxSpec, validate_spec
from sbxkit._plan.policy import build_create_body
from sbxkit.errors import SpecError


def _spec(runtime: str | None, pids: int, network: str = "none") -> SandboxSpec:
    limits = Limits(cpus=1, memory_bytes=64 * MiB, pids=pids, output_bytes=MiB, timeout_s=5)
    return SandboxSpec(
        image="img", command=["true"], limits=limits, runtime=runtime, network=network
    )


@pytest.mark.parametrize("runtime", ["runsc", "gvisor"])
def test_gvisor_refuses_bridge_naming_the_network_field(runtime: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_spec(_spec(runtime, GVISOR_MIN_PIDS, "bridge"))
    assert caught.value.field == "network"
    assert "--network=none" in caught.value.rule


@pytest.mark.parametrize("runtime", ["runsc", "gvisor"])
def test_gvisor_refuses_a_pids_ceiling_below_its_floor(runtime: str) -> None:
    with pytest.raises(SpecError) as caught:
        build_create_body(_spec(runtime, GVISOR_MIN_PIDS - 1), "lease-1")
    assert caught.value.field == "limits.pids"
    assert f"at least {GVISOR_MIN_PIDS}" in caught.value.rule
    body = build_create_body(_spec(runtime, GVISOR_MIN_PIDS), "lease-1")
    assert body.host_config.pids_limit == GVISOR_MIN_PIDS  # passed through, never adjusted
    assert body.host_config.runtime == "runsc"


@pytest.mark.parametrize("runtime", [None, "runc", "crun", "kata"])
def test_other_runtimes_keep_bridge_and_any_positive_pids(runtime: str | None) -> None:
    validate_spec(_spec(runtime, 1, "bridge"))
    check_runtime_fit(runtime, "bridge", 1)
    body = build_create_body(_spec(runtime, 1, "bridge"), "lease-1")
    assert body.host_config.network_mode == "bridge"


def test_the_check_follows_the_alias_not_the_spelling() -> None:
    check_runtime_fit("runsc-debug", "bridge", 1)  # another registration is not gVisor's
    with pytest.raises(SpecError):
        check_runtime_fit("gvisor", "none", 16)
