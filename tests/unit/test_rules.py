"""Policy rules: extra flags, networking and SBXKIT_ENV, environment ownership, runtimes.

Every refusal names its field and its rule; the parsers either return a value or raise
SpecError, whatever they are fed.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sbxkit._consumers.runner import run
from sbxkit._model.rules import (
    ENV_SIZE_LIMIT,
    HOST_GATEWAY_ALIAS,
    LEASE_LABEL,
    ONLY_LABELS,
    RUNTIME_ENV_KEYS,
    RUNTIME_ENV_RESERVE,
    check_env,
    check_network,
    env_size,
    extra_flag_refusal,
    merge_env,
    merge_labels,
    parse_extra_flags,
    runtime_env,
)
from sbxkit._model.runtimes import GVISOR_MIN_PIDS, check_runtime_registered, runtime_name
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec, validate_spec
from sbxkit._plan.plan import effective_settings
from sbxkit._plan.policy import build_create_body
from sbxkit.errors import EngineUnavailable, SpecError
from tests.unit.test_layers import IO_MODULES, ROOT, imports_of

LEASE = "0123abcd-lease"
COLD_UNICODE = settings(suppress_health_check=[HealthCheck.too_slow])


def make_spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "sbxkit-test/busybox:latest",
        "command": ["true"],
        "limits": Limits(
            cpus=1.0, memory_bytes=64 * MiB, pids=16, output_bytes=1024, timeout_s=5.0
        ),
    }
    values.update(overrides)
    return SandboxSpec(**values)


def body_of(spec: SandboxSpec, **kwargs: Any) -> dict[str, Any]:
    body = msgspec.json.decode(msgspec.json.encode(build_create_body(spec, LEASE, **kwargs)))
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize("module", ["_model/rules.py", "_model/gpu.py", "_grammar/profile.py"])
def test_the_new_policy_cores_do_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports_of(ROOT / module)}
    assert not roots & IO_MODULES, f"{module} imports {sorted(roots & IO_MODULES)}"


# --- extra_flags -------------------------------------------------------------------------------


def test_labels_are_the_only_accepted_flags() -> None:
    flags = ["--label=team=ml", "--label=empty=", "--label=url=a=b", "--label=team=ml"]
    assert parse_extra_flags(flags) == {"team": "ml", "empty": "", "url": "a=b"}
    assert parse_extra_flags([]) == {}


def test_extra_flag_labels_are_merged_into_the_body() -> None:
    body = body_of(make_spec(labels={"a": "1"}, extra_flags=["--label=team=x"]))
    assert body["Labels"] == {"a": "1", "team": "x", LEASE_LABEL: LEASE}


REFUSED_FLAGS: list[tuple[str, str, str]] = [
    ("--privileged", "--privileged", "privileged mode is refused"),
    ("--privileged=true", "--privileged", "privileged mode is refused"),
    ("--runtime=runsc", "--runtime", "the runtime is selected with runtime"),
    ("--runtime", "--runtime", "the runtime is selected with runtime"),
    ("--network=host", "--network", "networking is selected with network"),
    ("--network=bridge", "--network", "networking is selected with network"),
    ("--network=container:abc", "--network", "networking is selected with network"),
    ("--net=host", "--net", "networking is selected with network"),
    ("--publish=80:80", "--publish", "networking is selected with network"),
    ("-p", "-p", "networking is selected with network"),
    ("--add-host=a:1.2.3.4", "--add-host", "networking is selected with network"),
    ("--dns=8.8.8.8", "--dns", "networking is selected with network"),
    ("--pid=host", "--pid", "the PID namespace is always private"),
    ("--pid", "--pid", "the PID namespace is always private"),
    ("--mount=type=bind,src=/,dst=/h", "--mount", "mounts are declared in mounts"),
    ("-v", "-v", "mounts are declared in mounts"),
    ("-v/:/host", "-v", "mounts are declared in mounts"),
    ("--volume=/:/host", "--volume", "mounts are declared in mounts"),
    ("--volumes-from=other", "--volumes-from", "mounts are declared in mounts"),
    ("--tmpfs=/x", "--tmpfs", "mounts are declared in mounts"),
    ("--entrypoint=/bin/sh", "--entrypoint", "the entrypoint is always empty"),
    ("--env-file=/etc/secrets", "--env-file", "environment variables are set in env"),
    ("-e", "-e", "environment variables are set in env"),
    ("-eA=1", "-e", "environment variables are set in env"),
    ("--env=A=1", "--env", "environment variables are set in env"),
    ("--user=0", "--user", "the user is set with user"),
    ("--user=1000:1000", "--user", "the user is set with user"),
    ("-u", "-u", "the user is set with user"),
    ("-u0", "-u", "the user is set with user"),
    ("--group-add=0", "--group-add", "the user is set with user"),
    ("--cap-add=SYS_ADMIN", "--cap-add", "capabilities are always dropped"),
    ("--cap-add", "--cap-add", "capabilities are always dropped"),
    ("--security-opt=seccomp=unconfined", "--security-opt", "security options are fixed"),
    ("--device=/dev/kmsg", "--device", "host devices are never passed through"),
    ("--gpus=all", "--gpus", "GPUs are requested with gpus"),
    ("--ipc=host", "--ipc", "the IPC namespace is always private"),
    ("--userns=host", "--userns", "the user namespace mode is the daemon's"),
    ("--cgroupns=host", "--cgroupns", "the cgroup namespace is always private"),
    ("--memory=1g", "--memory", "limits are set in limits"),
    ("--memory-swap=-1", "--memory-swap", "limits are set in limits"),
    ("--memory-reservation=1g", "--memory-reservation", "limits are set in limits"),
    ("-m", "-m", "limits are set in limits"),
    ("--cpus=64", "--cpus", "limits are set in limits"),
    ("--cpu-shares=1024", "--cpu-shares", "limits are set in limits"),
    ("--cpuset-cpus=0-63", "--cpuset-cpus", "limits are set in limits"),
    ("--pids-limit=-1", "--pids-limit", "limits are set in limits"),
    ("--ulimit=fsize=-1", "--ulimit", "limits are set in limits"),
    ("--shm-size=8g", "--shm-size", "limits are set in limits"),
    ("--workdir=/", "--workdir", "the working directory is set with workdir"),
    ("--label", "--label", "write labels as one argument, --label=key=value"),
    ("--label=novalue", "--label", "write labels as one argument"),
    ("--label==v", "--label", "key must not be empty"),
    ("-l", "-l", "write labels as one argument"),
    ("--label-file=/x", "--label-file", "write labels as one argument"),
    ("--rm", "--rm", ONLY_LABELS),
    ("--restart=always", "--restart", ONLY_LABELS),
    ("--uts=host", "--uts", ONLY_LABELS),
    ("--sysctl=net.ipv4.ip_forward=1", "--sysctl", ONLY_LABELS),
    ("--tty", "--tty", ONLY_LABELS),
    ("-it", "-i", ONLY_LABELS),
    ("--", "--", ONLY_LABELS),
    ("-", "-", ONLY_LABELS),
    ("--future-flag=1", "--future-flag", ONLY_LABELS),
    ("label=x=y", "(not a flag)", ONLY_LABELS),
    ("", "(not a flag)", ONLY_LABELS),
]


@pytest.mark.parametrize(("flag", "name", "reason"), REFUSED_FLAGS)
def test_every_other_flag_is_refused_naming_the_flag_and_its_reason(
    flag: str, name: str, reason: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_extra_flags(["--label=ok=1", flag])
    assert info.value.field == "extra_flags[1]"
    assert info.value.rule.startswith(f"{name} is refused: ")
    assert reason in info.value.rule
    # The same refusal through the spec, before any body exists.
    with pytest.raises(SpecError) as through_spec:
        validate_spec(make_spec(extra_flags=[flag]))
    assert through_spec.value.field == "extra_flags[0]"
    assert through_spec.value.rule == info.value.rule


def test_refusals_do_not_echo_flag_values() -> None:
    with pytest.raises(SpecError) as info:
        parse_extra_flags(["--env=TOKEN=s3cret-value"])
    assert "s3cret-value" not in str(info.value)
    assert extra_flag_refusal("--env-file=/home/me/.secrets") == (
        "--env-file",
        "environment variables are set in env (a host value enters only when named)",
    )


def test_the_lease_label_is_reserved_in_extra_flags() -> None:
    with pytest.raises(SpecError) as info:
        parse_extra_flags([f"--label={LEASE_LABEL}=someone-else"])
    assert info.value.field == "extra_flags[0]"
    assert "reserved" in info.value.rule
    with pytest.raises(SpecError):
        build_create_body(make_spec(extra_flags=[f"--label={LEASE_LABEL}=x"]), LEASE)


def test_conflicting_labels_are_refused_not_resolved() -> None:
    with pytest.raises(SpecError) as info:
        parse_extra_flags(["--label=a=1", "--label=a=2"])
    assert (info.value.field, info.value.rule) == (
        "extra_flags[1]",
        "label 'a' is set twice with different values",
    )
    with pytest.raises(SpecError) as info:
        validate_spec(make_spec(labels={"a": "1"}, extra_flags=["--label=a=2"]))
    assert info.value.field == "extra_flags"
    assert "different values" in info.value.rule
    assert merge_labels({"a": "1"}, {"a": "1", "b": "2"}) == {"a": "1", "b": "2"}


@pytest.mark.parametrize("flag", ["--label=a=\n", "--label=a\x00=b", "--label=\x1b[31m=x"])
def test_control_characters_in_flags_are_refused(flag: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_extra_flags([flag])
    assert info.value.field == "extra_flags[0]"
    assert "control" in info.value.rule


@pytest.mark.parametrize("flags", ["--label=a=b", None, 3, [3], [None]])
def test_extra_flags_of_the_wrong_type_are_spec_errors(flags: Any) -> None:
    with pytest.raises(SpecError) as info:
        parse_extra_flags(flags)
    assert info.value.field.startswith("extra_flags")


_flag_texts = st.one_of(
    st.text(max_size=30),
    st.builds(lambda k, v: f"--label={k}={v}", st.text(max_size=10), st.text(max_size=10)),
    st.builds(
        lambda name, v: f"{name}={v}",
        st.sampled_from(["--label", "--privileged", "--memory", "--env", "-v", "--net"]),
        st.text(max_size=10),
    ),
)


@COLD_UNICODE
@given(st.lists(_flag_texts, max_size=6))
def test_extra_flags_parse_to_labels_or_raise_spec_error(flags: list[str]) -> None:
    outcome: dict[str, str] | SpecError
    try:
        outcome = parse_extra_flags(flags)
    except SpecError as error:
        outcome = error
    if isinstance(outcome, SpecError):
        assert outcome.field.startswith("extra_flags[")
        assert outcome.rule
        return
    labels = outcome
    assert all(flag.startswith("--label=") for flag in flags)
    assert LEASE_LABEL not in labels
    for flag in flags:
        key, _, value = flag.removeprefix("--label=").partition("=")
        assert labels[key] == value


# --- networking and SBXKIT_ENV -----------------------------------------------------------------


@pytest.mark.parametrize(
    "environment",
    [
        None,
        b"",
        b"  ",
        b"development",
        b"dev",
        b"LOCAL",
        b" staging ",
        b"stage",
        b"preview",
        b"test",
        b"CI",
        "dev",
    ],
)
def test_bridge_is_allowed_outside_production(environment: bytes | str | None) -> None:
    check_network("bridge", environment)
    check_network("none", environment)


@pytest.mark.parametrize("environment", [b"production", b"prod", b" PROD\n", b"Production"])
def test_bridge_is_refused_in_production(environment: bytes) -> None:
    with pytest.raises(SpecError) as info:
        check_network("bridge", environment)
    assert info.value.field == "network"
    assert info.value.rule.startswith("bridge networking is refused in production")
    check_network("none", environment)  # production does not refuse the default


@pytest.mark.parametrize(
    ("environment", "rule"),
    [(b"\xff\xfe", "is not valid UTF-8"), (b"prodution", "unknown value 'prodution'")],
)
def test_a_bad_sbxkit_env_is_an_error_only_when_bridge_is_requested(
    environment: bytes, rule: str
) -> None:
    check_network("none", environment)  # ignored: nothing depends on it
    with pytest.raises(SpecError) as info:
        check_network("bridge", environment)
    assert info.value.field == "SBXKIT_ENV"
    assert info.value.rule.startswith(rule)
    assert "network='bridge'" in info.value.rule


@pytest.mark.parametrize(
    ("network", "rule"),
    [
        ("host", "host networking is refused"),
        ("container:db", "container:* is refused"),
        ("default", "must be 'none', 'bridge' or 'managed'"),
        (None, "must be 'none', 'bridge', 'managed' or a table"),
    ],
)
def test_host_container_and_unknown_networks_are_refused_everywhere(
    network: Any, rule: str
) -> None:
    for environment in (None, b"development", b"production", b"\xff"):
        with pytest.raises(SpecError) as info:
            check_network(network, environment)
        assert info.value.field == "network"
        assert info.value.rule.startswith(rule)


def test_validate_spec_uses_the_settings_environment() -> None:
    bridge = make_spec(network="bridge")
    validate_spec(bridge, Settings(environment=b"staging"))
    with pytest.raises(SpecError) as info:
        validate_spec(bridge, Settings(environment=b"prod"))
    assert info.value.field == "network"
    with pytest.raises(SpecError):
        build_create_body(bridge, LEASE, settings=Settings(environment=b"production"))
    validate_spec(make_spec(), Settings(environment=b"production"))


def test_bridge_body_opens_the_network_and_names_the_host_gateway() -> None:
    body = body_of(make_spec(network="bridge"))
    assert body["HostConfig"]["NetworkMode"] == "bridge"
    assert body["NetworkDisabled"] is False
    assert body["HostConfig"]["ExtraHosts"] == [HOST_GATEWAY_ALIAS]
    assert HOST_GATEWAY_ALIAS == "host.docker.internal:host-gateway"


def test_default_body_stays_off_the_network() -> None:
    body = body_of(make_spec())
    assert body["HostConfig"]["NetworkMode"] == "none"
    assert body["NetworkDisabled"] is True
    assert "ExtraHosts" not in body["HostConfig"]


def test_effective_settings_reads_sbxkit_env_as_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(os.environb, b"SBXKIT_ENV", b"\xffprod")
    assert effective_settings(None).environment == b"\xffprod"
    monkeypatch.setitem(os.environb, b"SBXKIT_ENV", b"production")
    assert effective_settings(None).environment == b"production"
    # An explicit environment in the caller's settings wins over the process's.
    assert effective_settings(Settings(environment=b"dev")).environment == b"dev"
    monkeypatch.delitem(os.environb, b"SBXKIT_ENV")
    assert effective_settings(None).environment is None


async def test_run_refuses_bridge_in_production_before_contacting_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(os.environb, b"SBXKIT_ENV", b"prod")
    with pytest.raises(SpecError) as info:
        await run(make_spec(network="bridge"), socket_path="/nonexistent/docker.sock")
    assert info.value.field == "network"
    monkeypatch.setitem(os.environb, b"SBXKIT_ENV", b"\xff")
    with pytest.raises(SpecError) as info:
        await run(make_spec(network="bridge"), socket_path="/nonexistent/docker.sock")
    assert info.value.field == "SBXKIT_ENV"
    # Not bridge: the bad value is ignored and the run proceeds to the (missing) daemon.
    with pytest.raises(EngineUnavailable):
        await run(make_spec(), socket_path="/nonexistent/docker.sock")


# --- environment ownership ---------------------------------------------------------------------


def test_runtime_keys_overwrite_profile_and_spec_values() -> None:
    merged = merge_env(
        {"A": "profile", "B": "profile", "SBXKIT_LEASE": "profile"},
        {"B": "spec", "SBXKIT_LEASE": "evil", "SBXKIT_SANDBOX": "0", "SBXKIT_OTHER": "mine"},
        runtime=runtime_env(LEASE),
    )
    assert merged == {
        "A": "profile",
        "B": "spec",
        "SBXKIT_LEASE": LEASE,
        "SBXKIT_SANDBOX": "1",
        "SBXKIT_OTHER": "mine",  # only the keys the runtime sets are owned
    }
    assert set(runtime_env(LEASE)) == set(RUNTIME_ENV_KEYS)


def test_the_body_carries_the_lease_whatever_the_user_says() -> None:
    body = body_of(make_spec(env={"SBXKIT_LEASE": "evil", "SBXKIT_SANDBOX": "no", "X": "1"}))
    assert body["Env"][:4] == ["HOME=/tmp", f"SBXKIT_LEASE={LEASE}", "SBXKIT_SANDBOX=1", "X=1"]
    assert all("=" not in item for item in body["Env"][4:])  # the unset owned keys


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("", "key must not be empty"),
        ("A=B", "key must not contain '='"),
        ("A\0", "key must not contain control characters (NUL included)"),
        ("A\nB", "key must not contain whitespace"),
        ("#A", "key must not start with '#'"),
        (" A", "key must not contain whitespace"),
        ("A\tB", "key must not contain whitespace"),
        ("A\x1b", "key must not contain control characters (NUL included)"),
        ("A\x7f", "key must not contain control characters (NUL included)"),
        ("A\x9b", "key must not contain control characters (NUL included)"),
    ],
)
def test_malformed_keys_are_refused_in_every_layer(key: str, rule: str) -> None:
    for layers in (({key: "v"}, {}), ({}, {key: "v"}), ({key: "v"}, {key: "overwritten"})):
        with pytest.raises(SpecError) as info:
            merge_env(*layers, runtime=runtime_env(LEASE))
        assert (info.value.field, info.value.rule) == (f"env[{key!r}]", rule)
    with pytest.raises(SpecError) as info:
        validate_spec(make_spec(env={key: "v"}))
    assert (info.value.field, info.value.rule) == (f"env[{key!r}]", rule)


def test_values_may_not_hold_nul() -> None:
    with pytest.raises(SpecError) as info:
        check_env({"A": "x\0y"})
    assert (info.value.field, info.value.rule) == ("env['A']", "value must not contain NUL")


def test_env_size_counts_key_value_and_two_bytes() -> None:
    assert env_size({}) == 0
    assert env_size({"A": "bc"}) == 5
    assert env_size({"É": "✓"}) == 2 + 3 + 2  # UTF-8 bytes, as the kernel counts them


def test_the_total_environment_is_capped_exactly() -> None:
    runtime = runtime_env(LEASE)
    room = ENV_SIZE_LIMIT - env_size(runtime) - len("BIG") - 2
    merge_env({"BIG": "x" * room}, runtime=runtime)  # exactly at the cap
    with pytest.raises(SpecError) as info:
        merge_env({"BIG": "x" * (room + 1)}, runtime=runtime)
    assert info.value.field == "env"
    assert f"the limit is {ENV_SIZE_LIMIT}" in info.value.rule
    # Two layers count once per final key, not per layer.
    merge_env({"BIG": "x" * room}, {"BIG": "x" * room}, runtime=runtime)


def test_validate_spec_keeps_room_for_the_runtime_keys() -> None:
    room = ENV_SIZE_LIMIT - RUNTIME_ENV_RESERVE - len("BIG") - 2
    validate_spec(make_spec(env={"BIG": "x" * room}))
    build_create_body(make_spec(env={"BIG": "x" * room}), "l" * 128)
    with pytest.raises(SpecError) as info:
        validate_spec(make_spec(env={"BIG": "x" * (room + 1)}))
    assert info.value.field == "env"


# --- runtimes ----------------------------------------------------------------------------------


def test_runtime_names() -> None:
    assert runtime_name(None) is None
    assert runtime_name("gvisor") == "runsc"
    assert runtime_name("crun") == "crun"
    assert runtime_name("runc") == "runc"


def test_default_body_has_no_runtime_and_gvisor_means_runsc() -> None:
    assert "Runtime" not in body_of(make_spec())["HostConfig"]
    gvisor = make_spec(
        runtime="gvisor",
        limits=Limits(
            cpus=1.0, memory_bytes=64 * MiB, pids=GVISOR_MIN_PIDS, output_bytes=1024, timeout_s=5
        ),
    )
    assert body_of(gvisor)["HostConfig"]["Runtime"] == "runsc"
    assert body_of(make_spec(runtime="crun"))["HostConfig"]["Runtime"] == "crun"


def test_registered_runtimes_are_accepted() -> None:
    registered = ["runc", "crun", "io.containerd.runc.v2"]
    assert check_runtime_registered(None, registered) is None
    assert check_runtime_registered("crun", registered) == "crun"
    assert check_runtime_registered("gvisor", [*registered, "runsc"]) == "runsc"


def test_unregistered_runtimes_are_refused_listing_what_is_registered() -> None:
    with pytest.raises(SpecError) as info:
        check_runtime_registered("kata", ["runc", "crun"])
    assert info.value.field == "runtime"
    assert info.value.rule == "'kata' is not registered in the daemon; registered: crun, runc"
    with pytest.raises(SpecError) as info:
        check_runtime_registered("gvisor", {"runc": None, "crun": None})
    assert info.value.rule == (
        "'gvisor' (daemon name 'runsc') is not registered in the daemon; registered: crun, runc"
    )
    with pytest.raises(SpecError) as info:
        check_runtime_registered("runc", [])
    assert info.value.rule.endswith("registered: (none)")
