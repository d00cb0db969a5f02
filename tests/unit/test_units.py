"""Sizes as Docker reads them and durations with units, wherever sbxkit reads one (issue 25):
``sbxkit run``'s flags, a profile, a batch job line, ``sbxkit batch``'s defaults and the
supervisor's flags — one parser each (sbxkit/_model/units.py), the same refusal wording
everywhere."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sbxkit
from sbxkit._grammar.profile import decode_profile, profile_limits
from sbxkit._model.units import GiB, KiB, MiB, TiB, parse_duration, parse_size
from sbxkit.cli import build_parser, spec_from_args
from sbxkit.cli.batch import _budgets, configure, decode_jobs
from sbxkit.cli.jobs import defaults_from_args, normalize_limits
from sbxkit.errors import SpecError
from sbxkit.supervisor.config import build_parser as supervisor_parser
from sbxkit.supervisor.config import config_from_args

IMAGE = "sbxkit-test/busybox:latest"
BASE = f'[sandbox.docker]\nimage = "{IMAGE}"\n'


def run_limits(*argv: str) -> sbxkit.Limits:
    return spec_from_args(build_parser().parse_args(["run", *argv, IMAGE, "--", "true"])).limits


def profile_of(limits: str) -> dict[str, object]:
    profile = decode_profile(BASE + "[sandbox.docker.limits]\n" + limits)
    return profile_limits(profile.sandbox.docker.limits)


def batch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(["jobs.jsonl", "--out", "r.jsonl", *argv])


def test_the_public_units() -> None:
    assert (sbxkit.KiB, sbxkit.MiB, sbxkit.GiB) == (1024, 1024**2, 1024**3)
    assert (KiB, MiB, GiB, TiB) == (1024, 1024**2, 1024**3, 1024**4)


# --- sizes: what was refused before, everywhere a size is read ---------------------------------


def test_run_flags_take_fractional_sizes_and_the_t_unit() -> None:
    limits = run_limits("--memory", "1.5g", "--scratch", "1t", "--fsize", "0.5m")
    assert limits.memory_bytes == 1536 * MiB
    assert limits.scratch_bytes == TiB  # the documented range reaches 1 TiB
    assert limits.fsize_bytes == 512 * KiB


def test_a_profile_takes_docker_sizes() -> None:
    assert profile_of('memory = "1.5g"\nscratch = "1 TiB"\n') == {
        "memory_bytes": 1536 * MiB,
        "scratch_bytes": TiB,
    }


def test_a_job_line_takes_docker_sizes() -> None:
    assert normalize_limits({"memory": "1.5g", "shm": "0.25g"}) == {
        "memory_bytes": 1536 * MiB,
        "shm_bytes": 256 * MiB,
    }


def test_the_supervisor_budget_is_a_size() -> None:
    args = supervisor_parser().parse_args(["--memory-budget", "1.5g"])
    assert config_from_args(args).capacity.memory_budget_bytes == 1536 * MiB
    bare = supervisor_parser().parse_args(["--memory-budget", "1048576"])
    assert config_from_args(bare).capacity.memory_budget_bytes == MiB  # a bare number is bytes


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("2m30s", 150.0),
        ("5M", 300.0),
        (" 5m ", 300.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "timeout") == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "m", "5 m", "-5m", "5m-1s", "1e3s", "٥m"])
def test_bad_durations_are_refused_naming_the_field(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_duration(text, "limits.timeout")
    assert caught.value.field == "limits.timeout"


def test_run_timeout_takes_units() -> None:
    assert run_limits("--timeout", "5m").timeout_s == 300.0
    assert run_limits("--timeout", "500ms").timeout_s == 0.5
    assert run_limits("--timeout", "0.5").timeout_s == 0.5  # a bare number stays seconds


def test_a_profile_takes_durations() -> None:
    assert profile_of('timeout = "5m"\n') == {"timeout_s": 300.0}
    pool = decode_profile(
        BASE + '[sandbox.docker.pool]\nsize = 2\nidle_ttl = "2m"\nmax_timeout = "1h"\n'
    ).sandbox.docker.pool
    assert pool is not None
    assert (pool.idle_ttl, pool.max_timeout) == (120.0, 3600.0)


def test_a_job_line_and_batch_defaults_take_durations() -> None:
    defaults, _ = defaults_from_args(batch_args("--image", IMAGE, "--timeout", "5m"))
    lines = (
        b'{"id": 1, "command": ["true"], "limits": {"cpus": 1, "memory": "64m", "pids": 8, '
        b'"max_output": "1k"}}\n'
        b'{"id": 2, "command": ["true"], "limits": {"cpus": 1, "memory": "64m", "pids": 8, '
        b'"max_output": "1k", "timeout": "500ms"}}\n'
    )
    first, second = (job.spec.spec for job in decode_jobs(lines, defaults=defaults))
    assert first.limits.timeout_s == 300.0
    assert second.limits.timeout_s == 0.5


def test_the_supervisor_durations_take_units() -> None:
    args = supervisor_parser().parse_args(
        ["--admission-timeout", "5m", "--idle-exit", "500ms", "--reaper-interval", "2s"]
    )
    config = config_from_args(args)
    assert config.capacity.admission_timeout_s == 300.0
    assert (config.idle_exit_s, config.reaper_interval_s) == (0.5, 2.0)


@pytest.mark.parametrize("text", ["soon", "nan", "0", "-1"])
def test_a_bad_supervisor_duration_is_a_usage_error(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        supervisor_parser().parse_args(["--idle-exit", text])
    assert caught.value.code == 2
    assert "--idle-exit" in capsys.readouterr().err


# --- one wording, wherever the value is read ----------------------------------------------------


def _flag(kind: str, text: str) -> None:
    run_limits("--memory" if kind == "size" else "--timeout", text)


def _profile(kind: str, text: str) -> None:
    profile_of(f'{"memory" if kind == "size" else "timeout"} = "{text}"\n')


def _job(kind: str, text: str) -> None:
    normalize_limits({"memory" if kind == "size" else "timeout": text})


def _batch_default(kind: str, text: str) -> None:
    defaults_from_args(batch_args("--memory" if kind == "size" else "--timeout", text))


READERS: list[Callable[[str, str], None]] = [_flag, _profile, _job, _batch_default]


@pytest.mark.parametrize("kind", ["size", "duration"])
@pytest.mark.parametrize("text", ["lots", "5x", "-1"])
def test_every_reader_refuses_with_the_same_rule(kind: str, text: str) -> None:
    rules: set[str] = set()
    for read in READERS:
        with pytest.raises(SpecError) as caught:
            read(kind, text)
        rules.add(caught.value.rule)
    assert len(rules) == 1, rules


@given(st.text(max_size=30))
def test_parse_duration_returns_a_float_or_raises_spec_error(text: str) -> None:
    refusal: SpecError | None = None
    try:
        seconds = parse_duration(text, "x")
    except SpecError as error:
        refusal = error
    if refusal is not None:
        assert refusal.field == "x"
    else:
        assert isinstance(seconds, float)
        assert math.isnan(seconds) or seconds >= 0


@given(st.decimals(min_value=0, max_value=10**6, places=3), st.sampled_from("kmgt"))
def test_a_fractional_size_is_truncated_to_whole_bytes(number: Decimal, unit: str) -> None:
    multiplier = {"k": KiB, "m": MiB, "g": GiB, "t": TiB}[unit]
    exact = math.floor(Fraction(number) * multiplier)
    assert parse_size(f"{number}{unit}", "x") == exact


def test_the_batch_budget_is_a_size() -> None:
    memory, _ = _budgets(batch_args("--memory-budget", "1.5g"))
    assert memory == 1536 * MiB
