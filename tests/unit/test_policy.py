"""The create body pins every hardening field; a spec can add workload, never remove protection."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sbxkit._model.rules import SCRATCH_HOME, env_size
from sbxkit._model.runtimes import CRUN_MIN_FSIZE
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._model.uids import HOST_UIDS, uid_for_lease
from sbxkit._plan.policy import (
    LEASE_LABEL,
    SCRATCH_PATH,
    build_create_body,
    container_name,
    scratch_options,
)
from sbxkit.errors import SpecError

LEASE = "0123abcd-lease"


# Hypothesis builds its Unicode tables on the first text draw of a fresh checkout (~1.5 s);
# that one-off cost is not slow input generation.
COLD_UNICODE = settings(suppress_health_check=[HealthCheck.too_slow])


def make_spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "python:3.12-slim",
        "command": ["python", "-c", "print(1)"],
        "limits": Limits(
            cpus=1.5,
            memory_bytes=256 * MiB,
            pids=64,
            output_bytes=1024 * 1024,
            timeout_s=10.0,
        ),
    }
    values.update(overrides)
    return SandboxSpec(**values)


def encoded(spec: SandboxSpec, lease: str = LEASE) -> dict[str, Any]:
    """What actually goes over the wire, as the daemon will read it."""
    body = msgspec.json.decode(msgspec.json.encode(build_create_body(spec, lease)))
    assert isinstance(body, dict)
    return body


OWN = uid_for_lease(LEASE, HOST_UIDS)
"""The pinned body's lease's own uid (``sbxkit._model.uids``)."""
UNSET = ["SBXKIT_ENDPOINT", "SBXKIT_TLS_CA", "SBXKIT_TLS_CERT", "SBXKIT_TLS_KEY"]
"""Owned keys a body without a callback unsets (``unset_env``): Docker drops an image's value."""


def test_full_body_is_pinned() -> None:
    assert encoded(make_spec()) == {
        "Image": "python:3.12-slim",
        "Cmd": ["python", "-c", "print(1)"],
        "Entrypoint": [],
        # The runtime's own keys are always present (environment ownership, docs/security.md);
        # the callback's, which it sets only for a callback, are unset over the image's ENV.
        "Env": ["HOME=/tmp", f"SBXKIT_LEASE={LEASE}", "SBXKIT_SANDBOX=1", *UNSET],
        "User": f"{OWN}:{OWN}",
        "Labels": {LEASE_LABEL: LEASE},
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "OpenStdin": True,
        "StdinOnce": True,
        "Tty": False,
        "NetworkDisabled": True,
        "Healthcheck": {"Test": ["NONE"]},
        "HostConfig": {
            "NanoCpus": 1_500_000_000,
            "Memory": 256 * MiB,
            "MemorySwap": 256 * MiB,
            "PidsLimit": 64,
            "Ulimits": [
                {"Name": "fsize", "Soft": 64 * MiB, "Hard": 64 * MiB},
                {"Name": "msgqueue", "Soft": 0, "Hard": 0},
            ],
            "ShmSize": 64 * MiB,
            "ReadonlyRootfs": True,
            "IpcMode": "private",
            "CgroupnsMode": "private",
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "RestartPolicy": {"Name": "no"},
            "LogConfig": {"Type": "none"},
            "NetworkMode": "none",
            "Init": True,
            "Privileged": False,
            "AutoRemove": False,
            "Tmpfs": {
                "/tmp": (f"rw,nosuid,nodev,noexec,size={64 * MiB},mode=1777,uid={OWN},gid={OWN}")
            },
        },
    }


HARDENED_HOST_KEYS = {
    "NanoCpus",
    "Memory",
    "MemorySwap",
    "PidsLimit",
    "Ulimits",
    "ShmSize",
    "ReadonlyRootfs",
    "IpcMode",
    "CgroupnsMode",
    "CapDrop",
    "SecurityOpt",
    "RestartPolicy",
    "LogConfig",
    "NetworkMode",
    "Init",
    "Privileged",
    "AutoRemove",
    "Tmpfs",
}


def test_optional_fields_only_add_what_was_asked() -> None:
    body = encoded(
        make_spec(
            workdir="/work",
            runtime="crun",
            user="1000:2000",
            env={"B": "2", "A": "x=y"},
            labels={"team": "ml"},
            limits=Limits(
                cpus=0.25,
                memory_bytes=6 * MiB,
                pids=1,
                output_bytes=1,
                timeout_s=0.5,
                fsize_bytes=CRUN_MIN_FSIZE,  # crun cannot start under less
                scratch_bytes=8 * MiB,
                shm_bytes=2 * MiB,
            ),
        )
    )
    assert body["WorkingDir"] == "/work"
    assert body["User"] == "1000:2000"
    assert body["Env"] == ["A=x=y", "B=2", f"SBXKIT_LEASE={LEASE}", "SBXKIT_SANDBOX=1", *UNSET]
    assert body["Labels"] == {"team": "ml", LEASE_LABEL: LEASE}
    host = body["HostConfig"]
    assert set(host) == HARDENED_HOST_KEYS | {"Runtime"}
    assert host["Runtime"] == "crun"
    assert host["NanoCpus"] == 250_000_000
    assert host["Memory"] == host["MemorySwap"] == 6 * MiB
    assert host["PidsLimit"] == 1
    assert host["Ulimits"] == [
        {"Name": "fsize", "Soft": CRUN_MIN_FSIZE, "Hard": CRUN_MIN_FSIZE},
        {"Name": "msgqueue", "Soft": 0, "Hard": 0},
    ]
    assert host["ShmSize"] == 2 * MiB
    assert host["Tmpfs"] == {
        "/tmp": f"rw,nosuid,nodev,noexec,size={8 * MiB},mode=1777,uid=1000,gid=2000"
    }


def test_no_weakening_keys_are_ever_sent() -> None:
    body = encoded(make_spec(runtime="runc", workdir="/w", env={"A": "1"}, labels={"k": "v"}))
    host = body["HostConfig"]
    for key in (
        "CapAdd",
        "Binds",
        "Mounts",
        "Devices",
        "DeviceRequests",
        "ExtraHosts",
        "PidMode",
        "UsernsMode",
        "UTSMode",
        "VolumesFrom",
        "PortBindings",
        "PublishAllPorts",
        "Sysctls",
    ):
        assert key not in host
    assert host["Privileged"] is False
    assert host["AutoRemove"] is False
    assert set(host) == HARDENED_HOST_KEYS | {"Runtime"}
    assert set(body) == {
        "Image",
        "Cmd",
        "Entrypoint",
        "Env",
        "User",
        "WorkingDir",
        "Labels",
        "AttachStdin",
        "AttachStdout",
        "AttachStderr",
        "OpenStdin",
        "StdinOnce",
        "Tty",
        "NetworkDisabled",
        "Healthcheck",
        "HostConfig",
    }


def test_entrypoint_is_always_sent_empty() -> None:
    # Omitted would mean "the image's entrypoint"; [] means none, so only Cmd runs.
    body = encoded(make_spec(command=["/bin/true"]))
    assert body["Entrypoint"] == []
    assert body["Cmd"] == ["/bin/true"]


def test_lease_label_cannot_be_overridden() -> None:
    with pytest.raises(SpecError) as info:
        build_create_body(make_spec(labels={LEASE_LABEL: "someone-else"}), LEASE)
    assert info.value.field == f"labels[{LEASE_LABEL!r}]"


def test_body_is_validated_first() -> None:
    with pytest.raises(SpecError) as info:
        build_create_body(make_spec(network="host"), LEASE)
    assert info.value.field == "network"
    with pytest.raises(SpecError) as info:
        build_create_body(make_spec(limits=Limits(cpus=1.0)), LEASE)
    assert info.value.field.startswith("limits.memory_bytes, ")


def test_body_does_not_alias_the_spec() -> None:
    spec = make_spec(labels={"k": "v"})
    body = build_create_body(spec, LEASE)
    assert body.cmd is not spec.command
    assert spec.labels == {"k": "v"}


@COLD_UNICODE
@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), st.text()))
def test_env_encoding_is_sorted_key_equals_value(env: dict[str, str]) -> None:
    env = {key: value.replace("\0", "") for key, value in env.items()}
    body = encoded(make_spec(env=env))
    # a HOME of the spec's wins over the scratch one; the runtime's keys win over the spec's
    expected = {"HOME": "/tmp", **env, "SBXKIT_LEASE": LEASE, "SBXKIT_SANDBOX": "1"}
    assert body["Env"] == [*(f"{key}={expected[key]}" for key in sorted(expected)), *UNSET]
    parsed = dict(item.split("=", 1) for item in body["Env"][: -len(UNSET)])
    assert parsed == expected


def test_cpus_round_to_nanocpus() -> None:
    limits = Limits(cpus=0.1, memory_bytes=64 * MiB, pids=8, output_bytes=1, timeout_s=1)
    assert encoded(make_spec(limits=limits))["HostConfig"]["NanoCpus"] == 100_000_000


def test_scratch_options_follow_the_sandbox_user() -> None:
    assert SCRATCH_PATH == "/tmp"
    assert scratch_options(make_spec(user="4242:4343")) == (
        f"rw,nosuid,nodev,noexec,size={64 * MiB},mode=1777,uid=4242,gid=4343"
    )


def test_container_name() -> None:
    assert container_name(LEASE) == f"sbxkit-{LEASE}"


@pytest.mark.parametrize("lease", ["", "-x", "a/b", "a b", "a\0", "x" * 129, "é"])
def test_bad_leases_are_refused(lease: str) -> None:
    with pytest.raises(SpecError) as info:
        container_name(lease)
    assert info.value.field == "lease"
    with pytest.raises(SpecError):
        build_create_body(make_spec(), lease)


def test_a_sandbox_of_its_own_uid_gets_the_scratch_space_as_home() -> None:
    """No image's /etc/passwd names a uid of its own: runc would say HOME=/ (read-only), crun
    would leave it unset. A HOME the spec or the image sets stays; a named user keeps the
    image's own answer."""
    assert "HOME=/tmp" in encoded(make_spec())["Env"]
    assert "HOME=/work" in encoded(make_spec(env={"HOME": "/work"}))["Env"]
    assert not any(item.startswith("HOME") for item in encoded(make_spec(user="1000:1000"))["Env"])
    from_image = build_create_body(make_spec(), LEASE, image_env={"HOME": "/root"})
    assert not any(item.startswith("HOME") for item in from_image.env or [])


def test_validation_keeps_room_for_the_scratch_home() -> None:
    assert env_size(SCRATCH_HOME) == len("HOME") + len(SCRATCH_PATH) + 2
    assert SCRATCH_HOME == {"HOME": SCRATCH_PATH}
