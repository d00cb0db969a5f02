"""The supervisor's re-check: every body policy builds passes; every weakening is refused by field.

Policy must never produce a body the re-check refuses (a property over varied valid specs:
limits, users, env, labels, GPUs, bind/volume/tmpfs mounts, bridge via settings, Podman), and
each invariant, broken alone in an otherwise valid body, is refused naming its field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from sbxkit._model.gpu import GpuRequest
from sbxkit._model.mounts import BindMount, ResolvedMounts, TmpfsMount, VolumeMount
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.policy import LEASE_LABEL, build_create_body
from sbxkit._plan.preflight import _bind_string, tmpfs_options
from sbxkit.engine.models import ContainerCreate, MountSpec, VolumeReply
from sbxkit.errors import SpecError
from sbxkit.supervisor.config import Config
from sbxkit.supervisor.recheck import (
    allowed_engine_sockets,
    engine_socket_problem,
    recheck_body,
    unknown_field,
    volume_backing_problem,
)

LEASE = "0123456789abcdef0123456789abcdef"
STATE_DIR = "/var/lib/sbxkit/leases"
BIND_SOURCES = ("/srv/data", "/home/user/project", "/opt/models", "/var/lib/sbxkit-data")
TARGETS = ("/data", "/work", "/models", "/home/sandbox/in", "/opt/out")
TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), max_size=12)
CDI = ("nvidia.com/gpu=0", "nvidia.com/gpu=1", "amd.com/gpu=all", "nvidia.com/gpu=GPU-9a")


def recheck(body: ContainerCreate, environment: bytes | None = None) -> Any:
    return recheck_body(body, lease=LEASE, state_dir=STATE_DIR, environment=environment)


@st.composite
def valid_bodies(draw: st.DrawFn) -> ContainerCreate:
    """A body from build_create_body for a valid spec, with mounts resolved the way preflight
    resolves them (its own bind-string and tmpfs builders)."""
    podman = draw(st.booleans())
    uid = draw(st.integers(1, 2**31 - 1))
    gid = draw(st.integers(1, 2**31 - 1))
    user = f"{uid}:{gid}"
    targets = draw(st.lists(st.sampled_from(TARGETS), unique=True, max_size=3))
    mounts: list[Any] = []
    resolved = ResolvedMounts()
    for target in targets:
        kind = draw(st.sampled_from(["bind", "volume", "tmpfs"]))
        read_only = draw(st.booleans())
        if kind == "bind":
            bind = BindMount(
                source=draw(st.sampled_from(BIND_SOURCES)),
                target=target,
                read_only=read_only,
                selinux_label=draw(st.sampled_from([None, "shared", "private"])),
            )
            mounts.append(bind)
            resolved.binds.append(_bind_string(bind.source, bind))
        elif kind == "volume":
            name = draw(st.from_regex(r"[a-z0-9][a-z0-9_.-]{1,20}", fullmatch=True))
            mounts.append(VolumeMount(source=name, target=target, read_only=read_only))
            # What preflight._resolve_volume appends for an existing plain local volume.
            options: dict[str, object] = {"NoCopy": True}
            if draw(st.booleans()):
                options["Subpath"] = "sub/dir"
            resolved.mounts.append(
                MountSpec(
                    type="volume",
                    source=name,
                    target=target,
                    read_only=read_only,
                    volume_options=options,
                )
            )
        else:
            tmpfs = TmpfsMount(
                target=target,
                size_bytes=draw(st.integers(1, 2**40)),
                mode=draw(st.integers(0, 0o7777)),
                options=draw(st.lists(st.sampled_from(["ro", "exec", "nosuid", "nodev"]))),
            )
            mounts.append(tmpfs)
            resolved.tmpfs[target] = tmpfs_options(tmpfs, user, podman=podman)
    gpus = draw(
        st.none()
        | st.lists(st.sampled_from(CDI), min_size=1, max_size=4, unique=True).map(
            lambda ids: GpuRequest(devices=ids)
        )
    )
    spec = SandboxSpec(
        image="sbxkit-test/busybox:latest",
        command=["sh", "-c", "true"],
        user=user,
        env=draw(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), TEXT)),
        labels=draw(st.dictionaries(st.sampled_from(["team", "job", "x.y"]), TEXT)),
        workdir=draw(st.sampled_from([None, "/tmp", "/work"])),
        network=draw(st.sampled_from(["none", "bridge"])),
        runtime=draw(st.sampled_from([None, "runc", "crun", "runsc"])),
        gpus=gpus,
        mounts=mounts,
        limits=Limits(
            cpus=draw(st.sampled_from([0.01, 0.5, 1, 2.5, 1024])),
            memory_bytes=draw(st.integers(6 * MiB, 2**40)),
            pids=draw(st.integers(256, 4194304)),
            output_bytes=draw(st.integers(1, 2**40)),
            timeout_s=draw(st.floats(0.01, 86400)),
            fsize_bytes=draw(st.integers(1, 2**40)),
            scratch_bytes=draw(st.integers(1, 2**40)),
            shm_bytes=draw(st.integers(1, 2**40)),
        ),
    )
    environment = draw(st.sampled_from([None, b"", b"dev", b"staging", b"ci"]))
    operator = Settings(
        enable_bind_mounts=True,
        enable_named_volumes=True,
        supervisor_state_dir=STATE_DIR,
        labels=draw(st.dictionaries(st.sampled_from(["ci.job", "owner"]), TEXT)),
        environment=environment,
    )
    try:
        return build_create_body(spec, LEASE, settings=operator, resolved=resolved, podman=podman)
    except SpecError:
        reject()  # not a valid spec (e.g. bridge under gVisor); policy refuses it itself
        raise


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(valid_bodies())
def test_every_body_policy_builds_passes_the_recheck(body: ContainerCreate) -> None:
    assert recheck(body, environment=b"staging") is None
    raw = msgspec.json.decode(msgspec.json.encode(body))
    assert unknown_field(raw) is None


def plain_body(**spec_fields: Any) -> ContainerCreate:
    spec = SandboxSpec(
        image="sbxkit-test/busybox:latest",
        command=["true"],
        limits=Limits(cpus=1, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=5),
        **spec_fields,
    )
    return build_create_body(spec, LEASE)


def bent(change: Callable[[dict[str, Any]], None]) -> ContainerCreate:
    """The plain policy body with one change made in its JSON form (as a raw client would)."""
    data = msgspec.json.decode(msgspec.json.encode(plain_body()))
    change(data)
    return msgspec.json.decode(msgspec.json.encode(data), type=ContainerCreate)


def host(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["HostConfig"].__setitem__(key, value)


def config(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: data.__setitem__(key, value)


def drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["HostConfig"].pop(key)


def tmpfs(target: str, options: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["HostConfig"]["Tmpfs"].__setitem__(target, options)


SCRATCH = "rw,nosuid,nodev,noexec,size=1024,mode=1777,uid=65534,gid=65534"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (host("Privileged", True), "HostConfig.Privileged"),
        (host("CapAdd", ["SYS_ADMIN"]), "HostConfig.CapAdd"),
        (host("CapDrop", []), "HostConfig.CapDrop"),
        (host("CapDrop", ["NET_RAW"]), "HostConfig.CapDrop"),
        (drop("CapDrop"), "HostConfig.CapDrop"),
        (host("ReadonlyRootfs", False), "HostConfig.ReadonlyRootfs"),
        (drop("ReadonlyRootfs"), "HostConfig.ReadonlyRootfs"),
        (host("SecurityOpt", ["no-new-privileges", "seccomp=unconfined"]), "SecurityOpt"),
        (host("SecurityOpt", ["apparmor=unconfined"]), "HostConfig.SecurityOpt"),
        (host("SecurityOpt", []), "HostConfig.SecurityOpt"),
        (host("IpcMode", "host"), "HostConfig.IpcMode"),
        (host("CgroupnsMode", "host"), "HostConfig.CgroupnsMode"),
        (host("NetworkMode", "host"), "HostConfig.NetworkMode"),
        (host("NetworkMode", "container:abc"), "HostConfig.NetworkMode"),
        (config("NetworkDisabled", False), "Config.NetworkDisabled"),
        (host("ExtraHosts", ["evil:1.2.3.4"]), "HostConfig.ExtraHosts"),
        (host("Binds", ["/:/host:rw,rprivate"]), "HostConfig.Binds[0]"),
        (host("Binds", ["/:/host"]), "HostConfig.Binds[0]"),
        (host("Binds", ["/var/run/docker.sock:/d.sock:ro,rprivate"]), "HostConfig.Binds[0]"),
        (host("Binds", [f"{STATE_DIR}:/state:ro,rprivate"]), "HostConfig.Binds[0]"),
        (host("Binds", ["/var/lib/sbxkit:/state:ro,rprivate"]), "HostConfig.Binds[0]"),
        (host("Binds", ["/srv/data:/etc:ro,rprivate"]), "HostConfig.Binds[0]"),
        (host("Binds", ["/srv/data:/data:ro,rshared"]), "HostConfig.Binds[0]"),
        (host("Binds", ["/srv/data:/data:ro,rw,rprivate"]), "HostConfig.Binds[0]"),
        (host("Mounts", [{"Type": "bind", "Source": "/", "Target": "/h"}]), "HostConfig.Mounts"),
        (
            host(
                "Mounts",
                [
                    {
                        "Type": "volume",
                        "Source": "v1",
                        "Target": "/v",
                        "ReadOnly": False,
                        "VolumeOptions": {
                            "NoCopy": True,
                            "DriverConfig": {"Options": {"o": "bind", "device": "/"}},
                        },
                    }
                ],
            ),
            "HostConfig.Mounts[0].VolumeOptions",
        ),
        (tmpfs("/tmp", "rw,nosuid,nodev,noexec,mode=1777"), "HostConfig.Tmpfs[/tmp]"),
        (tmpfs("/tmp", "rw,nodev,noexec,size=1024"), "HostConfig.Tmpfs[/tmp]"),
        (tmpfs("/tmp", "rw,nosuid,nodev,exec,size=1024"), "HostConfig.Tmpfs[/tmp]"),
        (tmpfs("/tmp", SCRATCH + ",suid"), "HostConfig.Tmpfs[/tmp]"),
        (tmpfs("/usr", SCRATCH), "HostConfig.Tmpfs[/usr]"),
        (tmpfs("/run", "rw,nosuid,nodev,size=1024"), "HostConfig.Tmpfs[/run]"),
        (host("Tmpfs", {}), "HostConfig.Tmpfs"),
        (config("User", "0:0"), "Config.User"),
        (config("User", "root"), "Config.User"),
        (config("User", "1000"), "Config.User"),
        (lambda data: data.pop("User"), "Config.User"),
        (config("Labels", {LEASE_LABEL: "0" * 32}), f"Config.Labels.{LEASE_LABEL}"),
        (config("Labels", {}), f"Config.Labels.{LEASE_LABEL}"),
        (config("Entrypoint", ["/bin/sh"]), "Config.Entrypoint"),
        (config("Env", []), "Config.Env"),
        (config("Healthcheck", {"Test": ["CMD", "true"]}), "Config.Healthcheck"),
        (drop("PidsLimit"), "HostConfig.PidsLimit"),
        (host("PidsLimit", -1), "HostConfig.PidsLimit"),
        (drop("Memory"), "HostConfig.Memory"),
        (host("MemorySwap", -1), "HostConfig.MemorySwap"),
        (drop("NanoCpus"), "HostConfig.NanoCpus"),
        (drop("ShmSize"), "HostConfig.ShmSize"),
        (host("Ulimits", [{"Name": "fsize", "Soft": 1, "Hard": 1}]), "HostConfig.Ulimits"),
        (
            host("Ulimits", [{"Name": "fsize", "Soft": 1, "Hard": 2}]),
            "HostConfig.Ulimits[0]",
        ),
        (
            host("Ulimits", [{"Name": "msgqueue", "Soft": 819200, "Hard": 819200}]),
            "HostConfig.Ulimits[0]",
        ),
        (host("RestartPolicy", {"Name": "always"}), "HostConfig.RestartPolicy"),
        (host("LogConfig", {"Type": "json-file"}), "HostConfig.LogConfig"),
        (host("AutoRemove", True), "HostConfig.AutoRemove"),
        (
            host("DeviceRequests", [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]),
            "HostConfig.DeviceRequests[0]",
        ),
        (
            host("DeviceRequests", [{"Driver": "cdi", "DeviceIDs": ["/dev/sda"]}]),
            "HostConfig.DeviceRequests[0].DeviceIDs",
        ),
        (lambda data: data.pop("HostConfig"), "HostConfig"),
    ],
)
def test_each_weakening_is_refused_naming_its_field(
    change: Callable[[dict[str, Any]], None], field: str
) -> None:
    refusal = recheck(bent(change))
    assert refusal is not None
    assert field in refusal.field, refusal
    assert refusal.reason


def test_the_plain_policy_body_passes_so_each_refusal_above_is_the_change() -> None:
    assert recheck(plain_body()) is None


def test_bridge_passes_in_development_and_is_refused_in_production_or_unknown() -> None:
    body = build_create_body(
        SandboxSpec(
            image="i",
            command=["true"],
            network="bridge",
            limits=Limits(cpus=1, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=5),
        ),
        LEASE,
    )
    assert recheck(body, environment=None) is None
    assert recheck(body, environment=b"dev") is None
    for environment in (b"production", b"PROD ", b"prdo", b"\xff"):
        refusal = recheck(body, environment=environment)
        assert refusal is not None
        assert refusal.field == "HostConfig.NetworkMode"


def test_a_bind_through_a_link_is_refused_after_resolving() -> None:
    body = bent(host("Binds", ["/srv/data:/data:ro,rprivate"]))

    def resolve(path: str) -> str:
        return {"/srv/data": "/"}.get(path, path)

    assert recheck_body(body, lease=LEASE, state_dir=STATE_DIR, environment=None) is None
    refusal = recheck_body(
        body, lease=LEASE, state_dir=STATE_DIR, environment=None, resolve=resolve
    )
    assert refusal is not None
    assert refusal.field == "HostConfig.Binds[0]"
    assert "resolves to /" in refusal.reason


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"HostConfig": {"Devices": [{"PathOnHost": "/dev/sda"}]}}, "HostConfig.Devices"),
        ({"HostConfig": {"PidMode": "host"}}, "HostConfig.PidMode"),
        ({"HostConfig": {"UTSMode": "host"}}, "HostConfig.UTSMode"),
        ({"HostConfig": {"VolumesFrom": ["other"]}}, "HostConfig.VolumesFrom"),
        ({"HostConfig": {"Sysctls": {"kernel.x": "1"}}}, "HostConfig.Sysctls"),
        (
            {"HostConfig": {"Ulimits": [{"Name": "fsize", "Extra": 1}]}},
            "HostConfig.Ulimits[0].Extra",
        ),
        (
            {"HostConfig": {"Mounts": [{"Type": "volume", "Consistency": "x"}]}},
            "Mounts[0].Consistency",
        ),
        ({"Volumes": {"/data": {}}}, "Volumes"),
    ],
)
def test_fields_the_models_do_not_carry_are_named(raw: dict[str, Any], path: str) -> None:
    found = unknown_field(raw)
    assert found is not None
    assert found.endswith(path)


def test_engine_sockets_are_the_operators_or_the_start_environments() -> None:
    configured = Config(state_dir=STATE_DIR, engine_sockets=("/run/a.sock",))  # type: ignore[arg-type]
    assert allowed_engine_sockets(configured, {"DOCKER_HOST": "unix:///x.sock"}) == {"/run/a.sock"}
    plain = Config(state_dir=STATE_DIR)  # type: ignore[arg-type]
    assert allowed_engine_sockets(plain, {"DOCKER_HOST": "unix:///x.sock"}) == {"/x.sock"}
    assert "/var/run/docker.sock" in allowed_engine_sockets(plain, {})
    assert allowed_engine_sockets(plain, {"DOCKER_HOST": "tcp://1.2.3.4:2375"}) == frozenset()
    allowed = frozenset({"/run/a.sock"})
    assert engine_socket_problem("/run/a.sock", None, allowed) is None
    problem = engine_socket_problem("/tmp/evil.sock", None, allowed)
    assert problem is not None
    assert "/tmp/evil.sock" in problem
    assert "/run/a.sock" in problem
    assert engine_socket_problem("/tmp/evil.sock", "/run/relay.sock", allowed) is None


@pytest.mark.parametrize(
    ("driver", "options", "problem"),
    [
        ("local", None, None),
        ("local", {"type": "none", "o": "bind", "device": "/srv/data"}, None),
        ("nfs-plugin", None, "driver 'nfs-plugin'"),
        ("local", {"type": "none", "o": "bind", "device": "/"}, "host's root"),
        ("local", {"type": "none", "o": "rbind", "device": "/var/lib"}, "ancestor"),
        ("local", {"type": "none", "o": "bind", "device": STATE_DIR}, "supervisor state"),
        ("local", {"type": "nfs", "o": "addr=1.2.3.4", "device": ":/export"}, "plain bind"),
        ("local", {"type": "tmpfs", "device": "tmpfs"}, "plain bind"),
    ],
)
def test_a_named_volumes_backing_is_judged_as_a_bind(
    driver: str, options: dict[str, str] | None, problem: str | None
) -> None:
    volume = VolumeReply(name="v", driver=driver, options=options)
    found = volume_backing_problem(volume, STATE_DIR)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found
