"""The spec's directory-transfer bounds (``limits.transfer_bytes``, ``transfer_entries``):
the same names and rules in Python, profiles, job lines and ``sbxkit open``'s flags."""

from __future__ import annotations

import msgspec
import pytest

from sbxkit._grammar.profile import apply_profile, decode_profile
from sbxkit._model.spec import Limits, MiB, SandboxSpec, validate_spec
from sbxkit.cli.parser import build_parser
from sbxkit.cli.sessions import open_plan
from sbxkit.errors import SpecError

BASE = {"cpus": 1, "memory_bytes": 64 * MiB, "pids": 16, "output_bytes": 1024, "timeout_s": 5}


def test_the_defaults_are_a_gibibyte_and_a_hundred_thousand_entries() -> None:
    limits = msgspec.convert(BASE, Limits)
    assert (limits.transfer_bytes, limits.transfer_entries) == (1024 * MiB, 100_000)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("transfer_bytes", 0, "limits.transfer_bytes"),
        ("transfer_entries", 0, "limits.transfer_entries"),
        ("transfer_entries", 10_000_001, "limits.transfer_entries"),
    ],
)
def test_out_of_range_bounds_are_refused_by_name(field: str, value: int, rule: str) -> None:
    limits = msgspec.convert({**BASE, field: value}, Limits)
    with pytest.raises(SpecError, match=rule):
        validate_spec(SandboxSpec(image="busybox:1", command=["true"], limits=limits))


def test_a_profile_names_them_as_the_flags_do() -> None:
    profile = decode_profile(
        '[sandbox.docker]\nimage = "busybox:1"\n'
        '[sandbox.docker.limits]\ncpus = 1\nmemory = "64m"\npids = 16\nmax_output = "1k"\n'
        'timeout = 5\nmax_transfer = "2m"\nmax_transfer_entries = 50\n'
    )
    spec, _, _ = apply_profile(profile, ["true"])
    assert (spec.limits.transfer_bytes, spec.limits.transfer_entries) == (2 * MiB, 50)


def test_open_takes_them_as_flags_and_refuses_them_naming_the_flag() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["open", "--max-transfer", "3m", "--max-transfer-entries", "7", "busybox:1"]
    )
    plan = open_plan(args, "n")
    assert (plan.spec.limits.transfer_bytes, plan.spec.limits.transfer_entries) == (3 * MiB, 7)
    assert plan.files_root == "/tmp"
    with pytest.raises(SpecError, match="--max-transfer-entries"):
        open_plan(parser.parse_args(["open", "--max-transfer-entries", "0", "busybox:1"]), "n")


def test_a_job_line_names_them_as_profiles_do() -> None:
    from sbxkit.cli.jobs import normalize_limits

    assert normalize_limits({"max_transfer": "1m", "max_transfer_entries": 9}) == {
        "transfer_bytes": MiB,
        "transfer_entries": 9,
    }
