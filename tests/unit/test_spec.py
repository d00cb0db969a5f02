"""Spec validation: every refusal names its field, and nothing but SpecError ever escapes."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sbxkit._model.spec import (
    Limits,
    MiB,
    SandboxSpec,
    parse_size,
    parse_user,
    spec_from_dict,
    validate_spec,
)
from sbxkit.errors import SpecError

MANDATORY = ("cpus", "memory_bytes", "pids", "output_bytes", "timeout_s")


# Hypothesis builds its Unicode tables on the first text draw of a fresh checkout (~1.5 s);
# that one-off cost is not slow input generation.
COLD_UNICODE = settings(suppress_health_check=[HealthCheck.too_slow])


def good_limits(**overrides: Any) -> Limits:
    values: dict[str, Any] = {
        "cpus": 1.0,
        "memory_bytes": 256 * MiB,
        "pids": 64,
        "output_bytes": 1024 * 1024,
        "timeout_s": 10.0,
    }
    values.update(overrides)
    return Limits(**values)


def good_spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "python:3.12-slim",
        "command": ["python", "-c", "print(1)"],
        "limits": good_limits(),
    }
    values.update(overrides)
    return SandboxSpec(**values)


def good_dict() -> dict[str, Any]:
    return {
        "image": "python:3.12-slim",
        "command": ["python", "-c", "print(1)"],
        "limits": {
            "cpus": 1.0,
            "memory_bytes": 256 * MiB,
            "pids": 64,
            "output_bytes": 1024,
            "timeout_s": 10,
        },
    }


def refused(spec: SandboxSpec) -> SpecError:
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    return info.value


# --- limits ------------------------------------------------------------------------------------


def test_good_spec_passes_and_has_hardened_defaults() -> None:
    spec = good_spec()
    validate_spec(spec)
    assert spec.user is None  # a uid of its own, chosen under its lease (sbxkit._model.uids)
    assert spec.network == "none"
    assert spec.limits.fsize_bytes == 64 * MiB
    assert spec.limits.scratch_bytes == 64 * MiB
    assert spec.env == {}
    assert spec.labels == {}


def test_default_factories_are_not_shared() -> None:
    first, second = good_spec(), good_spec()
    first.env["A"] = "1"
    first.labels["k"] = "v"
    assert second.env == {}
    assert second.labels == {}


@pytest.mark.parametrize("name", MANDATORY)
def test_each_mandatory_limit_absent_is_refused(name: str) -> None:
    error = refused(good_spec(limits=good_limits(**{name: None})))
    assert error.field == f"limits.{name}"
    assert error.rule == "mandatory: set a finite bound"


def test_empty_limits_name_every_mandatory_field_in_one_error() -> None:
    error = refused(good_spec(limits=Limits()))  # type checkers refuse it; run time names all
    assert error.field == ", ".join(f"limits.{name}" for name in MANDATORY)
    assert error.rule == "mandatory: set a finite bound"


def test_missing_mandatory_limits_are_named_before_bad_ones() -> None:
    limits = msgspec.convert({"cpus": -1, "pids": 8, "output_bytes": 1}, Limits)
    error = refused(good_spec(limits=limits))
    assert error.field == "limits.memory_bytes, limits.timeout_s"


def test_one_missing_limit_is_named_alone() -> None:
    limits = msgspec.structs.replace(good_limits(), pids=None)
    assert refused(good_spec(limits=limits)).field == "limits.pids"


def test_spec_from_dict_names_every_missing_limit() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"image": "busybox", "command": ["true"], "limits": {"cpus": 1}})
    assert caught.value.field == (
        "limits.memory_bytes, limits.pids, limits.output_bytes, limits.timeout_s"
    )


@pytest.mark.parametrize("name", [*MANDATORY, "fsize_bytes", "scratch_bytes"])
@pytest.mark.parametrize("value", [0, -1, -5])
def test_zero_and_negative_limits_are_refused_as_unbounded(name: str, value: int) -> None:
    error = refused(good_spec(limits=good_limits(**{name: value})))
    assert error.field == f"limits.{name}"
    assert error.rule == "must be > 0 (0 and -1 mean unbounded to Docker)"


@pytest.mark.parametrize("name", [*MANDATORY, "fsize_bytes", "scratch_bytes"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinite_limits_are_refused(name: str, value: float) -> None:
    error = refused(good_spec(limits=good_limits(**{name: value})))
    assert error.field == f"limits.{name}"
    assert "finite" in error.rule


@pytest.mark.parametrize("name", ["memory_bytes", "pids", "output_bytes", "fsize_bytes"])
@pytest.mark.parametrize("value", [1.5, True, "100"])
def test_integer_limits_refuse_other_types(name: str, value: object) -> None:
    error = refused(good_spec(limits=good_limits(**{name: value})))
    assert error.field == f"limits.{name}"
    assert "integer" in error.rule


def test_memory_below_docker_minimum_is_refused() -> None:
    assert refused(good_spec(limits=good_limits(memory_bytes=6 * MiB - 1))).field == (
        "limits.memory_bytes"
    )
    validate_spec(good_spec(limits=good_limits(memory_bytes=6 * MiB)))


def test_cpus_bounds() -> None:
    validate_spec(good_spec(limits=good_limits(cpus=1024)))
    validate_spec(good_spec(limits=good_limits(cpus=0.01)))
    validate_spec(good_spec(limits=good_limits(cpus=2)))
    assert refused(good_spec(limits=good_limits(cpus=1024.5))).field == "limits.cpus"
    # Would round to NanoCpus=0, which Docker reads as "no limit".
    assert refused(good_spec(limits=good_limits(cpus=1e-10))).field == "limits.cpus"


def test_pids_ceiling() -> None:
    validate_spec(good_spec(limits=good_limits(pids=4_194_304)))
    assert refused(good_spec(limits=good_limits(pids=4_194_305))).field == "limits.pids"


def test_byte_limits_beyond_int64_are_refused() -> None:
    assert refused(good_spec(limits=good_limits(memory_bytes=2**63))).field == (
        "limits.memory_bytes"
    )


numbers = st.one_of(st.none(), st.floats(), st.integers())


@given(
    cpus=numbers,
    memory_bytes=numbers,
    pids=numbers,
    output_bytes=numbers,
    timeout_s=numbers,
    fsize_bytes=numbers,
    scratch_bytes=numbers,
)
def test_arbitrary_limits_pass_or_raise_spec_error(**values: Any) -> None:
    spec = good_spec(limits=Limits(**values))
    refusal: SpecError | None = None
    try:
        validate_spec(spec)
    except SpecError as error:
        refusal = error
    if refusal is not None:
        assert refusal.field.startswith("limits.")
        return
    # Accepted limits are real, finite, positive bounds.
    for name in MANDATORY:
        value = getattr(spec.limits, name)
        assert value is not None
        assert math.isfinite(value)
        assert value > 0


# --- identity, command, environment ------------------------------------------------------------


@pytest.mark.parametrize("user", ["0:0", "0:1000", "1000:0", "root", "root:root", "0", "00:10"])
def test_root_users_are_refused(user: str) -> None:
    error = refused(good_spec(user=user))
    assert error.field == "user"
    assert error.rule == "root users are refused"


@pytest.mark.parametrize(
    "user", ["nobody", "1000", "1000:", ":1000", "1000:1000:1", "-1:5", "1000:nogroup", " 1:1"]
)
def test_non_numeric_or_partial_users_are_refused(user: str) -> None:
    assert refused(good_spec(user=user)).field == "user"


@pytest.mark.parametrize("user", ["010:10", "4294967295:10", "10:99999999999"])
def test_ambiguous_or_out_of_range_ids_are_refused(user: str) -> None:
    assert refused(good_spec(user=user)).field == "user"


def test_parse_user() -> None:
    assert parse_user("65534:65534") == (65534, 65534)
    assert parse_user("1000:2000") == (1000, 2000)


@pytest.mark.parametrize("image", ["", "python 3", "py\tthon", "py\x00", "py\x7f"])
def test_bad_images_are_refused(image: str) -> None:
    assert refused(good_spec(image=image)).field == "image"


def test_command_rules() -> None:
    assert refused(good_spec(command=[])).field == "command"
    assert refused(good_spec(command=["sh", "-c", "a\0b"])).field == "command[2]"
    assert refused(good_spec(command=[""])).field == "command[0]"
    validate_spec(good_spec(command=["sh", "-c", ""]))


@pytest.mark.parametrize(
    "key",
    ["", "A=B", "A\0", "A\nB", "A B", " A", "A\t", "#A", "A\x01"],
)
def test_bad_env_keys_are_refused(key: str) -> None:
    error = refused(good_spec(env={key: "v"}))
    assert error.field == f"env[{key!r}]"
    assert error.rule.startswith("key ")


def test_env_values_may_hold_anything_but_nul() -> None:
    validate_spec(good_spec(env={"A": "x=y\n #z \t", "B": ""}))
    error = refused(good_spec(env={"A": "x\0y"}))
    assert error.field == "env['A']"
    assert "NUL" in error.rule


# --- network, workdir, runtime, labels ---------------------------------------------------------


@pytest.mark.parametrize(
    ("network", "rule"),
    [
        ("host", "host networking is refused: it shares the host's network"),
        (
            "container:x",
            "container:* is refused: it shares another container's network namespace",
        ),
        ("default", "must be 'none', 'bridge' or 'managed', got 'default'"),
        ("", "must be 'none', 'bridge' or 'managed', got ''"),
        ("NONE", "must be 'none', 'bridge' or 'managed', got 'NONE'"),
        ("Bridge", "must be 'none', 'bridge' or 'managed', got 'Bridge'"),
    ],
)
def test_only_network_none_bridge_or_managed_is_accepted(network: str, rule: str) -> None:
    error = refused(good_spec(network=network))
    assert error.field == "network"
    assert error.rule == rule


def test_bridge_is_accepted_outside_production() -> None:
    # Without settings (a pure call) SBXKIT_ENV is unset, i.e. development; the production
    # refusal is covered in test_rules.py and, through run(), in the engine tests.
    validate_spec(good_spec(network="bridge"))


def test_workdir_must_be_absolute() -> None:
    validate_spec(good_spec(workdir="/work"))
    assert refused(good_spec(workdir="work")).field == "workdir"
    assert refused(good_spec(workdir="")).field == "workdir"
    assert refused(good_spec(workdir="/a\0b")).field == "workdir"


@pytest.mark.parametrize("runtime", ["runc", "runsc-debug", "io.containerd.runc.v2", "crun-1_2"])
def test_plain_runtime_names_pass(runtime: str) -> None:
    validate_spec(good_spec(runtime=runtime))


@pytest.mark.parametrize("runtime", ["", "/usr/bin/runc", "run c", "runc --debug", "a:b"])
def test_runtime_paths_and_options_are_refused(runtime: str) -> None:
    assert refused(good_spec(runtime=runtime)).field == "runtime"


def test_lease_label_is_reserved() -> None:
    error = refused(good_spec(labels={"sbxkit.lease": "other"}))
    assert error.field == "labels['sbxkit.lease']"
    assert "reserved" in error.rule


@pytest.mark.parametrize("labels", [{"a\nb": "v"}, {"k": "v\x00"}, {"k": "\x1b[31m"}, {"": "v"}])
def test_bad_labels_are_refused(labels: dict[str, str]) -> None:
    assert refused(good_spec(labels=labels)).field.startswith("labels[")


# --- spec_from_dict ----------------------------------------------------------------------------


def test_spec_from_dict_round_trip() -> None:
    spec = spec_from_dict(good_dict())
    assert spec.limits.timeout_s == 10.0
    assert spec == msgspec.convert(msgspec.to_builtins(spec), SandboxSpec)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["limits"].update(cpu=1), "limits.cpu"),
        (lambda d: d.update(privileged=True), "privileged"),
        (lambda d: d.update(entrypoint=["sh"]), "entrypoint"),
    ],
)
def test_unknown_fields_are_refused_by_name(mutate: Any, field: str) -> None:
    data = good_dict()
    mutate(data)
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    assert info.value.field == field
    assert info.value.rule == "unknown field"


@pytest.mark.parametrize(
    ("data_change", "field"),
    [
        ({"image": 3}, "image"),
        ({"command": ["ok", 1]}, "command[1]"),
        ({"limits": {"pids": "64"}}, "limits.pids"),
        ({"limits": {"memory_bytes": True}}, "limits.memory_bytes"),
    ],
)
def test_wrong_types_name_the_path(data_change: dict[str, Any], field: str) -> None:
    data = good_dict()
    for key, value in data_change.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    assert info.value.field == field


def test_missing_required_field_is_named() -> None:
    data = good_dict()
    del data["image"]
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    assert info.value.field == "image"


def test_not_an_object_is_refused() -> None:
    with pytest.raises(SpecError) as info:
        spec_from_dict(["not", "a", "spec"])
    assert info.value.field == "spec"


def test_spec_from_dict_runs_validation() -> None:
    data = good_dict()
    del data["limits"]["timeout_s"]
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    assert info.value.field == "limits.timeout_s"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@COLD_UNICODE
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "image": json_values,
            "command": json_values,
            "limits": st.dictionaries(
                st.sampled_from([*MANDATORY, "fsize_bytes", "scratch_bytes", "cpu"]), json_values
            ),
            "env": json_values,
            "user": json_values,
            "network": json_values,
            "labels": json_values,
        },
    )
)
def test_spec_from_dict_returns_or_raises_spec_error(data: dict[str, Any]) -> None:
    with contextlib.suppress(SpecError):
        spec_from_dict(data)


# --- parse_size --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("0", 0),
        ("1b", 1),
        ("512k", 512 * 1024),
        ("512K", 512 * 1024),
        ("512KiB", 512 * 1024),
        ("256m", 256 * MiB),
        ("256M", 256 * MiB),
        ("64MiB", 64 * MiB),
        ("64mib", 64 * MiB),
        ("1g", 1024 * MiB),
        ("2GiB", 2048 * MiB),
        ("64mb", 64 * MiB),  # binary, as docker run --memory 64mb reads it
        ("512MB", 512 * MiB),
        ("10kb", 10 * 1024),
        ("1gb", 1024 * MiB),
        (" 8m ", 8 * MiB),
        ("007", 7),
        # Issue 25: what Docker's RAMInBytes accepts — fractions (truncated to whole bytes),
        # t and p, one space before the unit.
        ("1.5g", 1536 * MiB),
        ("0.5m", 512 * 1024),
        ("0.1k", 102),  # 102.4 bytes, truncated as Docker truncates
        ("1.5", 1),
        (".5k", 512),
        ("12 m", 12 * MiB),
        ("1t", 1024 * 1024 * MiB),
        ("1tb", 1024 * 1024 * MiB),
        ("1TiB", 1024 * 1024 * MiB),
        ("1p", 1024**5),
    ],
)
def test_parse_size_accepts(text: str, expected: int) -> None:
    assert parse_size(text, "limits.memory_bytes") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-1",
        "-1m",
        "1e6",
        "1e3k",  # Docker's ParseFloat takes exponents by accident; sbxkit does not
        "m",
        "12  m",
        "1kk",
        "1bb",
        "1ki",
        "1kbytes",
        "1.5.3g",
        "ten",
        "0x10",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: isdigit() but not a byte count
        "9223372036854775808",
        "8589934592g",  # 2**63 bytes
        "1" * 5000,
    ],
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_size(text, "limits.memory_bytes")
    assert info.value.field == "limits.memory_bytes"


@COLD_UNICODE
@given(st.text())
def test_parse_size_returns_int_or_raises_spec_error(text: str) -> None:
    size: int | None = None
    refusal: SpecError | None = None
    try:
        size = parse_size(text, "x")
    except SpecError as error:
        refusal = error
    if refusal is not None:
        assert refusal.field == "x"
    else:
        assert size is not None
        assert 0 <= size <= 2**63 - 1


@pytest.mark.parametrize("image", ["../x", "busybox?x=1", "busybox#1", "a/../b", "-rm"])
def test_image_references_that_would_break_the_url_path_are_refused(image: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_spec(good_spec(image=image))
    assert caught.value.field == "image"


# --- the command's size (issue 27, finding 7) ----------------------------------------------------


def test_one_argument_longer_than_the_kernel_takes_is_refused_naming_it() -> None:
    from sbxkit._model.spec import MAX_ARG_BYTES

    assert validate_spec(good_spec(command=["echo", "x" * MAX_ARG_BYTES])) is None
    error = refused(good_spec(command=["echo", "x" * (MAX_ARG_BYTES + 1)]))
    assert error.field == "command[1]"
    assert "Linux" in error.rule


def test_a_command_larger_than_the_bound_is_refused_on_every_path_alike() -> None:
    # 15 args of 128,000 bytes used to fail at run time with a WireError on the cold path
    # (the held path ran it): now a SpecError naming the command, before anything starts.
    error = refused(good_spec(command=["echo", *["x" * 128_000] * 15]))
    assert error.field == "command"
    assert validate_spec(good_spec(command=["echo", *["x" * 128_000] * 8])) is None
