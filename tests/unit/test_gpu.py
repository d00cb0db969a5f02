"""CDI GPU requests: validation, device discovery, round-robin selection, the create body.

All pure (plus a stub engine for the preflight shell). Nothing here has run on a real GPU:
the daemon these tests are developed against (Docker 20.10) has no CDI support at all.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._model.gpu import (
    MAX_GPUS,
    GpuCursor,
    GpuRequest,
    cdi_supported,
    device_request,
    discovered_cdi_devices,
    resolve_gpus,
    select_gpus,
    selectable_gpus,
    validate_gpu_request,
)
from sbxkit._model.spec import Limits, MiB, SandboxSpec, spec_from_dict, validate_spec
from sbxkit._plan.policy import build_create_body
from sbxkit._plan.preflight import DaemonPlan, check_daemon
from sbxkit.engine.models import DiscoveredDevice, InfoReply
from sbxkit.errors import SpecError

LEASE = "gpu-lease"
GPUS = ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2"]


def make_spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "sbxkit-test/python:latest",
        "command": ["nvidia-smi"],
        "limits": Limits(
            cpus=1.0, memory_bytes=64 * MiB, pids=16, output_bytes=1024, timeout_s=5.0
        ),
    }
    values.update(overrides)
    return SandboxSpec(**values)


def info_with(
    devices: list[tuple[str, str]] | None, spec_dirs: list[str] | None = None
) -> InfoReply:
    """An /info reply as a daemon would send it (decoded from JSON, unknown fields included)."""
    doc: dict[str, Any] = {"ServerVersion": "28.1.0", "Runtimes": {"runc": {"path": "runc"}}}
    if devices is not None:
        doc["DiscoveredDevices"] = [{"Source": s, "ID": i} for s, i in devices]
    if spec_dirs is not None:
        doc["CDISpecDirs"] = spec_dirs
    doc["SomeFutureField"] = {"x": 1}
    return msgspec.json.decode(msgspec.json.encode(doc), type=InfoReply)


def cdi_info(ids: list[str]) -> InfoReply:
    return info_with([("cdi", i) for i in ids], ["/etc/cdi", "/var/run/cdi"])


# --- validation ----------------------------------------------------------------------------------


def test_good_requests_pass() -> None:
    validate_gpu_request(GpuRequest(count=1))
    validate_gpu_request(GpuRequest(devices=["nvidia.com/gpu=0"]))
    validate_gpu_request(GpuRequest(count=2, devices=GPUS[:2]))
    validate_gpu_request(GpuRequest(devices=["nvidia.com/gpu=GPU-955ef018-3bd9", "amd.com/gpu=1"]))
    validate_spec(make_spec(gpus=GpuRequest(count=MAX_GPUS)))


@pytest.mark.parametrize(
    ("request_", "field", "rule"),
    [
        (GpuRequest(), "gpus", "give a count or a list of CDI devices"),
        (GpuRequest(count=0), "gpus.count", "must be > 0 (omit gpus for none)"),
        (GpuRequest(count=-1), "gpus.count", "must be > 0 (omit gpus for none)"),
        (GpuRequest(count=True), "gpus.count", "must be an integer"),
        (GpuRequest(count=MAX_GPUS + 1), "gpus.count", f"must be <= {MAX_GPUS}"),
        (GpuRequest(devices=[]), "gpus.devices", "must not be empty (omit gpus for none)"),
        (
            GpuRequest(devices=[GPUS[0], GPUS[1], GPUS[0]]),
            "gpus.devices[2]",
            "duplicate device 'nvidia.com/gpu=0' (also devices[0])",
        ),
        (
            GpuRequest(count=3, devices=GPUS[:2]),
            "gpus.count",
            "count 3 does not match the 2 devices listed",
        ),
        (
            GpuRequest(count=1, devices=GPUS[:2]),
            "gpus.count",
            "count 1 does not match the 2 devices listed",
        ),
    ],
)
def test_bad_requests_are_refused(request_: GpuRequest, field: str, rule: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_gpu_request(request_)
    assert (info.value.field, info.value.rule) == (field, rule)
    with pytest.raises(SpecError) as info:
        validate_spec(make_spec(gpus=request_))
    assert (info.value.field, info.value.rule) == (field, rule)


@pytest.mark.parametrize(
    "device", ["gpu0", "0", "nvidia.com/gpu", "=0", "nvidia.com/gpu=", "a/b=c d", "/gpu=0", 0]
)
def test_device_names_must_be_qualified_cdi_names(device: Any) -> None:
    with pytest.raises(SpecError) as info:
        validate_gpu_request(GpuRequest(devices=[GPUS[0], device]))
    assert info.value.field == "gpus.devices[1]"
    assert "vendor/class=name" in info.value.rule


def test_spec_from_dict_refuses_unknown_gpu_fields() -> None:
    data = {
        "image": "x",
        "command": ["true"],
        "limits": {
            "cpus": 1,
            "memory_bytes": 64 * MiB,
            "pids": 1,
            "output_bytes": 1,
            "timeout_s": 1,
        },
        "gpus": {"count": 1, "driver": "nvidia"},
    }
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    assert (info.value.field, info.value.rule) == ("gpus.driver", "unknown field")


# --- discovery -----------------------------------------------------------------------------------


def test_discovered_devices_keep_only_cdi_sources() -> None:
    info = info_with([("cdi", GPUS[0]), ("nvidia-legacy", "GPU-1"), ("cdi", GPUS[1]), ("cdi", "")])
    assert discovered_cdi_devices(info) == GPUS[:2]
    assert discovered_cdi_devices(info_with(None)) is None


def test_cdi_support_is_spec_dirs_or_discovery() -> None:
    assert not cdi_supported(info_with(None))  # Docker 20.10: neither field
    assert not cdi_supported(info_with(None, []))
    assert cdi_supported(info_with(None, ["/etc/cdi"]))
    assert cdi_supported(info_with([]))


def test_selectable_gpus_are_gpu_class_devices_in_numeric_order() -> None:
    discovered = [
        "nvidia.com/gpu=10",
        "vendor.com/fpga=0",
        "nvidia.com/gpu=2",
        "nvidia.com/gpu=all",
        "nvidia.com/gpu=2",
    ]
    assert selectable_gpus(discovered) == ["nvidia.com/gpu=2", "nvidia.com/gpu=10"]


def test_index_names_win_over_aliases_of_the_same_gpu() -> None:
    discovered = [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=GPU-aaaa",
        "nvidia.com/gpu=1",
        "nvidia.com/gpu=GPU-bbbb",
        "nvidia.com/gpu=all",
    ]
    assert selectable_gpus(discovered) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert selectable_gpus(["nvidia.com/gpu=GPU-bbbb", "nvidia.com/gpu=GPU-aaaa"]) == [
        "nvidia.com/gpu=GPU-aaaa",
        "nvidia.com/gpu=GPU-bbbb",
    ]


def test_all_only_daemons_offer_all_as_one_device() -> None:
    assert selectable_gpus(["nvidia.com/gpu=all"]) == ["nvidia.com/gpu=all"]
    ids, cursor = resolve_gpus(GpuRequest(count=1), cdi_info(["nvidia.com/gpu=all"]), 0)
    assert (ids, cursor) == (["nvidia.com/gpu=all"], 0)
    with pytest.raises(SpecError) as info:
        resolve_gpus(GpuRequest(count=2), cdi_info(["nvidia.com/gpu=all"]), 0)
    assert info.value.field == "gpus.count"
    assert "offers 1 selectable CDI GPU(s): nvidia.com/gpu=all" in info.value.rule


# --- round robin ---------------------------------------------------------------------------------


def test_round_robin_walks_and_wraps() -> None:
    cursor = 0
    picks = []
    for _ in range(4):
        ids, cursor = select_gpus(GPUS, 2, cursor)
        picks.append(ids)
    assert picks == [GPUS[0:2], [GPUS[2], GPUS[0]], GPUS[1:3], GPUS[0:2]]
    assert select_gpus(GPUS, 3, 7) == ([GPUS[1], GPUS[2], GPUS[0]], 1)


def test_select_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="outside"):
        select_gpus(GPUS, 4, 0)
    with pytest.raises(ValueError, match="outside"):
        select_gpus([], 1, 0)


@given(
    st.integers(min_value=1, max_value=8),
    st.data(),
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=1, max_value=20),
)
def test_round_robin_never_repeats_and_spreads_evenly(
    total: int, data: st.DataObject, cursor: int, rounds: int
) -> None:
    devices = [f"nvidia.com/gpu={i}" for i in range(total)]
    count = data.draw(st.integers(min_value=1, max_value=total))
    tally: Counter[str] = Counter()
    for _ in range(rounds):
        ids, cursor = select_gpus(devices, count, cursor)
        assert len(ids) == len(set(ids)) == count
        assert 0 <= cursor < total
        tally.update(ids)
    assert max(tally[d] for d in devices) - min(tally[d] for d in devices) <= 1


# --- resolution against a daemon -----------------------------------------------------------------


def test_daemons_without_cdi_are_refused() -> None:
    docker_20_10 = msgspec.json.decode(
        b'{"ServerVersion": "20.10.24", "CDISpecDirs": null, "Runtimes": {}}', type=InfoReply
    )
    for request_ in (GpuRequest(count=1), GpuRequest(devices=GPUS[:1])):
        with pytest.raises(SpecError) as info:
            resolve_gpus(request_, docker_20_10, 0)
        assert info.value.field == "gpus"
        assert "has no CDI support" in info.value.rule
        assert "20.10.24" in info.value.rule


def test_a_count_needs_discovery_but_an_explicit_list_does_not() -> None:
    docker_25 = info_with(None, ["/etc/cdi"])
    assert resolve_gpus(GpuRequest(devices=GPUS[:2]), docker_25, 5) == (GPUS[:2], 5)
    with pytest.raises(SpecError) as info:
        resolve_gpus(GpuRequest(count=1), docker_25, 0)
    assert info.value.field == "gpus.count"
    assert "DiscoveredDevices" in info.value.rule


def test_explicit_devices_must_be_discovered_when_the_daemon_lists_them() -> None:
    with pytest.raises(SpecError) as info:
        resolve_gpus(GpuRequest(devices=["nvidia.com/gpu=7"]), cdi_info(GPUS), 0)
    assert info.value.field == "gpus.devices[0]"
    assert info.value.rule.startswith("'nvidia.com/gpu=7' is not among the daemon's CDI devices")


def test_counts_beyond_the_daemon_are_refused() -> None:
    with pytest.raises(SpecError) as info:
        resolve_gpus(GpuRequest(count=4), cdi_info(GPUS), 0)
    assert info.value.field == "gpus.count"
    assert info.value.rule.startswith("asks for 4 GPU(s); the daemon offers 3")
    with pytest.raises(SpecError) as info:
        resolve_gpus(GpuRequest(count=1), cdi_info([]), 0)
    assert "offers 0 selectable CDI GPU(s): (none)" in info.value.rule


def test_counts_resolve_round_robin() -> None:
    info = cdi_info(GPUS)
    assert resolve_gpus(GpuRequest(count=2), info, 0) == (GPUS[:2], 2)
    assert resolve_gpus(GpuRequest(count=2), info, 2) == ([GPUS[2], GPUS[0]], 1)


# --- the body ------------------------------------------------------------------------------------


def test_device_request_is_cdi_ids_only() -> None:
    encoded = msgspec.json.decode(msgspec.json.encode(device_request(GPUS[:2])))
    assert encoded == {"Driver": "cdi", "DeviceIDs": GPUS[:2]}


def host_config(spec: SandboxSpec, **kwargs: Any) -> dict[str, Any]:
    body = msgspec.json.decode(msgspec.json.encode(build_create_body(spec, LEASE, **kwargs)))
    host: dict[str, Any] = body["HostConfig"]
    return host


def test_body_carries_resolved_or_explicit_devices() -> None:
    assert "DeviceRequests" not in host_config(make_spec())
    explicit = make_spec(gpus=GpuRequest(devices=GPUS[1:]))
    assert host_config(explicit)["DeviceRequests"] == [{"Driver": "cdi", "DeviceIDs": GPUS[1:]}]
    counted = make_spec(gpus=GpuRequest(count=1))
    assert host_config(counted, gpu_devices=[GPUS[2]])["DeviceRequests"] == [
        {"Driver": "cdi", "DeviceIDs": [GPUS[2]]}
    ]


def test_body_refuses_unresolved_or_unasked_devices() -> None:
    with pytest.raises(SpecError) as info:
        build_create_body(make_spec(gpus=GpuRequest(count=1)), LEASE)
    assert info.value.field == "gpus.count"
    with pytest.raises(SpecError) as info:
        build_create_body(make_spec(), LEASE, gpu_devices=GPUS[:1])
    assert info.value.field == "gpus"
    with pytest.raises(SpecError) as info:
        build_create_body(make_spec(gpus=GpuRequest(count=1)), LEASE, gpu_devices=[])
    assert info.value.field == "gpus"


# --- the preflight shell -------------------------------------------------------------------------


class StubEngine:
    """Answers /info from a fixed reply and counts the calls."""

    is_podman = False

    def __init__(self, info: InfoReply) -> None:
        self.reply = info
        self.calls = 0
        self.socket_path = f"/stub/{uuid.uuid4().hex}.sock"  # preflight keeps verdicts per socket

    async def info(self) -> InfoReply:
        self.calls += 1
        return self.reply

    async def cached_info(self) -> InfoReply:
        return await self.info()  # the stub does not cache: every call is counted


async def test_default_runs_ask_the_daemon_once_a_minute_whether_it_is_rootless() -> None:
    """Default runs judge /info (a rootless daemon that cannot hold the limits is refused)
    once per socket a minute, as the uid range is: the one-shot path's hot loop stays free."""
    engine = StubEngine(cdi_info(GPUS))
    for _ in range(3):
        assert await check_daemon(engine, make_spec(), GpuCursor()) == DaemonPlan()  # type: ignore[arg-type]
    assert engine.calls == 1


async def test_the_shell_owns_the_cursor() -> None:
    engine = StubEngine(cdi_info(GPUS))
    cursor = GpuCursor()
    spec = make_spec(gpus=GpuRequest(count=2))
    plans = [await check_daemon(engine, spec, cursor) for _ in range(3)]  # type: ignore[arg-type]
    assert [p.gpu_devices for p in plans] == [GPUS[0:2], [GPUS[2], GPUS[0]], GPUS[1:3]]
    assert cursor.position == 0
    assert engine.calls == 3 + 1  # each GPU choice, and the rootless check's one answer


async def test_the_shell_refuses_a_gpu_request_on_a_daemon_without_cdi() -> None:
    engine = StubEngine(info_with(None))
    cursor = GpuCursor(position=1)
    with pytest.raises(SpecError) as info:
        await check_daemon(engine, make_spec(gpus=GpuRequest(count=1)), cursor)  # type: ignore[arg-type]
    assert info.value.field == "gpus"
    assert cursor.position == 1


async def test_the_shell_checks_runtime_registration() -> None:
    engine = StubEngine(info_with(None))
    with pytest.raises(SpecError) as info:
        await check_daemon(engine, make_spec(runtime="gvisor"), GpuCursor())  # type: ignore[arg-type]
    assert info.value.field == "runtime"
    assert "'runsc'" in info.value.rule
    plan = await check_daemon(engine, make_spec(runtime="runc"), GpuCursor())  # type: ignore[arg-type]
    assert plan == DaemonPlan(runtime="runc")


def test_discovered_device_model_reads_the_api_names() -> None:
    device = msgspec.json.decode(
        b'{"Source": "cdi", "ID": "nvidia.com/gpu=0"}', type=DiscoveredDevice
    )
    assert (device.source, device.id) == ("cdi", "nvidia.com/gpu=0")


def test_inspect_replies_expose_device_requests_and_extra_hosts_for_verification() -> None:
    from sbxkit.engine.models import ContainerInspect

    info = msgspec.json.decode(
        b'{"Id": "c", "HostConfig": {"ExtraHosts": ["host.docker.internal:host-gateway"],'
        b' "DeviceRequests": [{"Driver": "cdi", "Count": 0, "DeviceIDs": ["nvidia.com/gpu=0"],'
        b' "Capabilities": null, "Options": {}}]}}',
        type=ContainerInspect,
    )
    [request] = info.host_config.device_requests or []
    assert (request.driver, request.device_ids) == ("cdi", ["nvidia.com/gpu=0"])
    assert info.host_config.extra_hosts == ["host.docker.internal:host-gateway"]
