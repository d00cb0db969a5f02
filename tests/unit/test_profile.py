"""Profiles: TOML decoded with msgspec, unknown keys named by path, values checked by the same
rules as a spec, and turned into (SandboxSpec, Settings, SupervisorOptions)."""

from __future__ import annotations

import contextlib
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sbxkit._grammar.profile import (
    MAX_PROFILE_BYTES,
    Profile,
    SupervisorOptions,
    apply_profile,
    decode_profile,
    load_profile,
    profile_from_dict,
    supervisor_command,
)
from sbxkit._model.gpu import GpuRequest
from sbxkit._model.mounts import BindMount, TmpfsMount, VolumeMount
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, validate_spec
from sbxkit.errors import SpecError

FULL = """
[sandbox.docker]
image = "sbxkit-test/python:latest"
user = "1000:1000"
runtime = "crun"
network = "bridge"
workdir = "/work"
extra_flags = ["--label=team=ml"]
enable_bind_mounts = true
enable_named_volumes = true

[sandbox.docker.env]
MODE = "batch"
HOME_LITERAL = "$HOME"

[sandbox.docker.labels]
owner = "data"

[sandbox.docker.limits]
cpus = 2
memory = "256m"
pids = 128
max_output = 4096
timeout = 30
fsize = "1m"
scratch = "16MiB"

[[sandbox.docker.mounts]]
type = "bind"
source = "/srv/data"
target = "/data"

[[sandbox.docker.mounts]]
type = "volume"
source = "cache"
target = "/cache"
read_only = false
subpath = "py"

[[sandbox.docker.mounts]]
type = "tmpfs"
target = "/scratch"
size_bytes = 1048576
options = ["exec"]

[sandbox.docker.gpus]
count = 1

[sandbox.docker.supervisor]
binary = "/opt/sbx tools/sbxkit-supervisor"
state_dir = "/var/lib/sbxkit/leases"
"""


def refused(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        decode_profile(text)
    return info.value


def test_a_full_profile_decodes() -> None:
    docker = decode_profile(FULL).sandbox.docker
    assert docker.image == "sbxkit-test/python:latest"
    assert docker.user == "1000:1000"
    assert docker.runtime == "crun"
    assert docker.network == "bridge"
    assert docker.workdir == "/work"
    assert docker.env == {"MODE": "batch", "HOME_LITERAL": "$HOME"}
    assert docker.labels == {"owner": "data"}
    assert docker.extra_flags == ["--label=team=ml"]
    assert (docker.enable_bind_mounts, docker.enable_named_volumes) == (True, True)
    assert docker.limits.cpus == 2.0
    assert docker.limits.memory == "256m"
    assert docker.mounts == [
        BindMount(source="/srv/data", target="/data"),
        VolumeMount(source="cache", target="/cache", read_only=False, subpath="py"),
        TmpfsMount(target="/scratch", size_bytes=MiB, options=["exec"]),
    ]
    assert docker.gpus == GpuRequest(count=1)
    assert docker.supervisor == SupervisorOptions(
        binary="/opt/sbx tools/sbxkit-supervisor", state_dir="/var/lib/sbxkit/leases"
    )


def test_apply_profile_gives_spec_settings_and_supervisor_options() -> None:
    spec, operator, supervisor = apply_profile(decode_profile(FULL), ["python3", "-V"])
    assert spec.image == "sbxkit-test/python:latest"
    assert spec.command == ["python3", "-V"]
    assert spec.limits == Limits(
        cpus=2.0,
        memory_bytes=256 * MiB,
        pids=128,
        output_bytes=4096,
        timeout_s=30.0,
        fsize_bytes=MiB,
        scratch_bytes=16 * MiB,
    )
    assert spec.env == {"MODE": "batch", "HOME_LITERAL": "$HOME"}  # never expanded
    assert spec.labels == {"owner": "data"}
    assert spec.extra_flags == ["--label=team=ml"]
    assert (spec.user, spec.workdir, spec.runtime, spec.network) == (
        "1000:1000",
        "/work",
        "crun",
        "bridge",
    )
    assert spec.gpus == GpuRequest(count=1)
    assert len(spec.mounts) == 3
    assert operator == Settings(
        enable_bind_mounts=True,
        enable_named_volumes=True,
        supervisor_state_dir="/var/lib/sbxkit/leases",
        supervisor_command="'/opt/sbx tools/sbxkit-supervisor'",
    )
    assert supervisor.binary == "/opt/sbx tools/sbxkit-supervisor"
    command = supervisor_command(supervisor)
    assert command is not None
    assert shlex.split(command) == ["/opt/sbx tools/sbxkit-supervisor"]
    assert supervisor_command(SupervisorOptions()) is None
    validate_spec(spec, operator)


def test_a_minimal_profile_leaves_everything_else_at_the_spec_defaults() -> None:
    spec, operator, supervisor = apply_profile(
        decode_profile("[sandbox.docker]\n"), ["true"], image="img"
    )
    assert spec.image == "img"
    assert spec.limits == Limits()  # mandatory limits unset: the caller must supply them
    assert (spec.user, spec.network, spec.runtime, spec.env) == (None, "none", None, {})
    assert operator == Settings()
    assert supervisor == SupervisorOptions()


def test_an_explicit_image_overrides_the_profile_and_one_is_required() -> None:
    profile = decode_profile(FULL)
    spec, _, _ = apply_profile(profile, ["true"], image="other:1")
    assert spec.image == "other:1"
    with pytest.raises(SpecError) as info:
        apply_profile(decode_profile("[sandbox.docker]\n"), ["true"])
    assert info.value.field == "image"
    assert "sandbox.docker.image" in info.value.rule


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[sandbox.docker]\nlimts = 1", "sandbox.docker.limts"),
        ("[sandbox.docker.limits]\ncpu = 1", "sandbox.docker.limits.cpu"),
        ("[sandbox.dockr]", "sandbox.dockr"),
        ("[sandbox.docker]\n[sandbox.podman]", "sandbox.podman"),
        ("image = 'x'\n[sandbox.docker]", "image"),
        ("[sandbox.docker.supervisor]\nbin = '/x'", "sandbox.docker.supervisor.bin"),
        ("[sandbox.docker.gpus]\ndriver = 'nvidia'", "sandbox.docker.gpus.driver"),
        (
            "[[sandbox.docker.mounts]]\ntype='tmpfs'\ntarget='/x'\nsize_bytes=1\nsauce=1",
            "sandbox.docker.mounts[0].sauce",
        ),
        ("[sandbox.docker]\nprivileged = true", "sandbox.docker.privileged"),
        ("[sandbox.docker]\nauto_remove = false", "sandbox.docker.auto_remove"),
    ],
)
def test_unknown_keys_are_refused_by_full_path(text: str, field: str) -> None:
    error = refused(text)
    assert (error.field, error.rule) == (field, "unknown field")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("", "sandbox"),
        ("[sandbox]", "sandbox.docker"),
        ("[[sandbox.docker.mounts]]\ntype='bind'\ntarget='/x'", "sandbox.docker.mounts[0].source"),
    ],
)
def test_missing_tables_and_fields_are_named(text: str, field: str) -> None:
    error = refused(text)
    assert (error.field, error.rule) == (field, "required field is missing")


@pytest.mark.parametrize(
    ("text", "field", "rule_part"),
    [
        ("[sandbox.docker.limits]\nmemory = true", "sandbox.docker.limits.memory", "Expected"),
        (
            "[sandbox.docker]\nenable_bind_mounts = 'yes'",
            "sandbox.docker.enable_bind_mounts",
            "Expected `bool`",
        ),
        ("[sandbox.docker]\nenv = {A = 1}", "sandbox.docker.env[...]", "Expected `str`"),
        (
            "[[sandbox.docker.mounts]]\ntype='nfs'\ntarget='/x'",
            "sandbox.docker.mounts[0].type",
            "Invalid value 'nfs'",
        ),
        ("[sandbox.docker]\nuser = '0:0'", "sandbox.docker.user", "root users are refused"),
        ("[sandbox.docker]\nuser = 'nobody'", "sandbox.docker.user", "numeric"),
        ("[sandbox.docker]\nimage = 'a b'", "sandbox.docker.image", "whitespace"),
        ("[sandbox.docker]\nruntime = 'run c'", "sandbox.docker.runtime", "plain runtime name"),
        ("[sandbox.docker]\nnetwork = 'host'", "sandbox.docker.network", "host networking"),
        (
            "[sandbox.docker]\nnetwork = 'container:x'",
            "sandbox.docker.network",
            "container:* is refused",
        ),
        (
            "[sandbox.docker]\nnetwork = 'default'",
            "sandbox.docker.network",
            "must be 'none', 'bridge'",
        ),
        ("[sandbox.docker]\nworkdir = 'rel'", "sandbox.docker.workdir", "absolute"),
        ("[sandbox.docker.env]\n'A=B' = 'v'", "sandbox.docker.env['A=B']", "'='"),
        ("[sandbox.docker.env]\n'#A' = 'v'", "sandbox.docker.env['#A']", "'#'"),
        (
            "[sandbox.docker.labels]\n'sbxkit.lease' = 'x'",
            "sandbox.docker.labels['sbxkit.lease']",
            "reserved",
        ),
        (
            "[sandbox.docker]\nextra_flags = ['--label=a=1', '--privileged']",
            "sandbox.docker.extra_flags[1]",
            "--privileged is refused",
        ),
        (
            "[sandbox.docker]\nextra_flags = ['--network=host']",
            "sandbox.docker.extra_flags[0]",
            "networking is selected with network",
        ),
        ("[sandbox.docker.limits]\nmemory = '0'", "sandbox.docker.limits.memory", "must be > 0"),
        ("[sandbox.docker.limits]\nmemory = '1xb'", "sandbox.docker.limits.memory", "unknown unit"),
        ("[sandbox.docker.limits]\nmemory = '2t'", "sandbox.docker.limits.memory", "must be <="),
        (
            "[sandbox.docker.limits]\nmemory = 1024",
            "sandbox.docker.limits.memory",
            "Docker's minimum",
        ),
        ("[sandbox.docker.limits]\ncpus = 0", "sandbox.docker.limits.cpus", "must be > 0"),
        ("[sandbox.docker.limits]\ncpus = nan", "sandbox.docker.limits.cpus", "finite"),
        ("[sandbox.docker.limits]\npids = -1", "sandbox.docker.limits.pids", "must be > 0"),
        ("[sandbox.docker.limits]\ntimeout = inf", "sandbox.docker.limits.timeout", "finite"),
        (
            "[sandbox.docker.limits]\nmax_output = '-1'",
            "sandbox.docker.limits.max_output",
            "negative",
        ),
        ("[sandbox.docker.gpus]\ncount = 0", "sandbox.docker.gpus.count", "must be > 0"),
        ("[sandbox.docker.gpus]\ndevices = []", "sandbox.docker.gpus.devices", "must not be empty"),
        (
            "[[sandbox.docker.mounts]]\ntype='bind'\nsource='/srv'\ntarget='/x'",
            "sandbox.docker.mounts[0].type",
            "bind mounts are disabled",
        ),
        (
            "[[sandbox.docker.mounts]]\ntype='volume'\nsource='v'\ntarget='/x'",
            "sandbox.docker.mounts[0].type",
            "named volumes are disabled",
        ),
        (
            "[sandbox.docker]\nenable_bind_mounts = true\n[[sandbox.docker.mounts]]\ntype='bind'\n"
            "source='/var/run/docker.sock'\ntarget='/x'",
            "sandbox.docker.mounts[0].source",
            "protected",
        ),
        (
            "[sandbox.docker]\nenable_bind_mounts = true\n[[sandbox.docker.mounts]]\ntype='bind'\n"
            "source='/srv/leases/x'\ntarget='/x'\n[sandbox.docker.supervisor]\n"
            "state_dir='/srv/leases'",
            "sandbox.docker.mounts[0].source",
            "state directory",
        ),
        (
            "[sandbox.docker.supervisor]\nstate_dir = 'leases'",
            "sandbox.docker.supervisor.state_dir",
            "absolute",
        ),
        (
            "[sandbox.docker.supervisor]\nstate_dir = '/a/../b'",
            "sandbox.docker.supervisor.state_dir",
            "'..'",
        ),
        (
            "[sandbox.docker.supervisor]\nbinary = 'sbxkit-supervisor'",
            "sandbox.docker.supervisor.binary",
            "absolute",
        ),
        (
            '[sandbox.docker.supervisor]\nbinary = "/bin/x\\u001b"',
            "sandbox.docker.supervisor.binary",
            "control",
        ),
    ],
)
def test_values_are_checked_with_their_profile_path(text: str, field: str, rule_part: str) -> None:
    error = refused(text)
    assert error.field == field
    assert rule_part in error.rule


def test_bad_toml_and_bad_bytes_are_spec_errors() -> None:
    error = refused("[sandbox.docker\n")
    assert error.field == "profile"
    assert error.rule.startswith("is not valid TOML")
    with pytest.raises(SpecError) as info:
        decode_profile(b"[sandbox.docker]\nimage = '\xff'")
    assert (info.value.field, info.value.rule) == ("profile", "is not UTF-8 (TOML files are UTF-8)")


def test_load_profile_reads_one_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(FULL)
    assert load_profile(path) == decode_profile(FULL)
    assert load_profile(str(path)) == decode_profile(FULL)
    with pytest.raises(SpecError) as info:
        load_profile(tmp_path / "missing.toml")
    assert info.value.field == "profile"
    assert "cannot read" in info.value.rule
    path.write_text("[sandbox.docker\n")
    with pytest.raises(SpecError) as info:
        load_profile(path)
    assert info.value.field == f"profile {path}"
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_PROFILE_BYTES + 1))
    with pytest.raises(SpecError) as info:
        load_profile(big)
    assert "larger than" in info.value.rule


def test_decoded_profiles_are_msgspec_structs() -> None:
    assert isinstance(profile_from_dict(tomllib.loads(FULL)), Profile)


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.text(max_size=8), max_size=3),
)
_docker_keys = st.sampled_from(
    [
        "image",
        "user",
        "runtime",
        "network",
        "workdir",
        "env",
        "labels",
        "extra_flags",
        "enable_bind_mounts",
        "enable_named_volumes",
        "limits",
        "mounts",
        "gpus",
        "supervisor",
        "limts",
    ]
)
_values = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "source",
                    "target",
                    "count",
                    "devices",
                    "memory",
                    "cpus",
                    "binary",
                    "state_dir",
                    "A",
                    "x",
                ]
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_docker_keys, _values, max_size=6))
def test_profiles_decode_or_raise_spec_error(docker: dict[str, Any]) -> None:
    with contextlib.suppress(SpecError):
        profile = profile_from_dict({"sandbox": {"docker": docker}})
        with contextlib.suppress(SpecError):
            apply_profile(profile, ["true"], image="img")
