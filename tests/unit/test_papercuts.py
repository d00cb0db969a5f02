"""The papercuts a new user hits on the command line (issue 15): ``--version``, a flag typo's
usage, ``--json`` errors, piped stdin, and ``sbxkit batch``'s defaults, sizes and retries."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from sbxkit._grammar.run_grammar import stdin_of
from sbxkit._model.spec import MiB
from sbxkit._util.stdin import FileStdin
from sbxkit.cli import EXIT_REFUSED, main
from sbxkit.cli.batch import configure, decode_jobs
from sbxkit.cli.jobs import (
    defaults_from_args,
    forget_error_lines,
    normalize_limits,
    with_defaults,
    without_error_lines,
)
from sbxkit.errors import SpecError

IMAGE = "sbxkit-test/busybox:latest"


def exit_of(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert isinstance(caught.value.code, int)
    return caught.value.code


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert exit_of(["--version"]) == 0
    assert capsys.readouterr().out == f"sbxkit {version('sbxkit')}\n"


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["run", "--memroy", "64m", IMAGE, "--", "true"], "usage: sbxkit run"),
        (["batch", "jobs.jsonl", "--out", "r.jsonl", "--paralel", "2"], "usage: sbxkit batch"),
    ],
)
def test_a_flag_typo_prints_the_subcommands_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_of(argv) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "unrecognized arguments: " in err


def test_json_prints_an_error_object_for_a_refused_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", "--json", "--socket", "/nonexistent/d.sock", "--memory", "64", IMAGE, "true"]
    assert exit_of(argv) == EXIT_REFUSED
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == EXIT_REFUSED
    assert doc["error"]["type"] == "SpecError"
    assert doc["error"]["field"] == "--memory"  # the flag, not limits.memory_bytes
    assert "did you mean 64m?" in doc["error"]["message"]


def test_json_prints_an_error_object_for_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert exit_of(["run", "--json", "--bogus", IMAGE, "--", "true"]) == EXIT_REFUSED
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["type"] == "UsageError"
    assert "--bogus" in doc["error"]["message"]


def test_without_json_an_error_prints_nothing_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", "--socket", "/nonexistent/d.sock", "--memory", "64", IMAGE, "true"]
    assert exit_of(argv) == EXIT_REFUSED
    assert capsys.readouterr().out == ""


@pytest.fixture
def piped_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"data")
    os.close(write_end)
    monkeypatch.setattr(sys, "stdin", os.fdopen(read_end, "r"))


@pytest.mark.usefixtures("piped_stdin")
def test_piped_stdin_without_the_flag_is_refused_not_dropped() -> None:
    with pytest.raises(SpecError) as caught:
        stdin_of(None, streamed=True)
    assert caught.value.field == "--stdin"
    assert "--stdin -" in caught.value.rule
    assert "--stdin none" in caught.value.rule


@pytest.mark.usefixtures("piped_stdin")
def test_piped_stdin_is_read_with_dash_and_ignored_with_none() -> None:
    assert stdin_of("none", streamed=True) is None
    assert stdin_of("-", streamed=False) == b"data"  # the sbx runtime takes bytes


@pytest.mark.usefixtures("piped_stdin")
async def test_piped_stdin_is_streamed_for_docker() -> None:
    stream = stdin_of("-", streamed=True)
    assert isinstance(stream, FileStdin)  # opened and read only inside the run
    async with stream:
        assert await stream.receive_some() == b"data"
        assert await stream.receive_some() == b""


def test_devnull_stdin_needs_no_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    with open(os.devnull) as null:
        monkeypatch.setattr(sys, "stdin", null)
        assert stdin_of(None, streamed=True) is None


# --- batch -----------------------------------------------------------------------------------


def test_job_limits_take_run_names_and_size_strings() -> None:
    assert normalize_limits(
        {"cpus": 1, "memory": "64mb", "max_output": "1m", "timeout": 5, "scratch_bytes": "8m"}
    ) == {
        "cpus": 1,
        "memory_bytes": 64 * MiB,
        "output_bytes": MiB,
        "timeout_s": 5,
        "scratch_bytes": 8 * MiB,
    }


def test_a_limit_given_under_both_names_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        normalize_limits({"memory": "64m", "memory_bytes": 64 * MiB})
    assert caught.value.field == "limits.memory_bytes"


def test_a_bad_size_names_the_jobs_field() -> None:
    with pytest.raises(SpecError) as caught:
        normalize_limits({"memory": "lots"})
    assert caught.value.field == "limits.memory"


def test_a_job_line_overrides_defaults_and_merges_mappings() -> None:
    defaults = {
        "image": "a",
        "limits": {"cpus": 1, "memory_bytes": 64 * MiB},
        "env": {"A": "1", "B": "1"},
    }
    job = {"command": ["true"], "limits": {"memory": "128m"}, "env": {"B": "2"}}
    assert with_defaults(job, defaults) == {
        "image": "a",
        "command": ["true"],
        "limits": {"cpus": 1, "memory_bytes": 128 * MiB},
        "env": {"A": "1", "B": "2"},
    }


def batch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(["jobs.jsonl", "--out", "r.jsonl", *argv])


def test_profile_and_flags_give_every_job_its_defaults(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(
        f"""
[sandbox.docker]
image = "{IMAGE}"
env = {{ FROM = "profile" }}

[sandbox.docker.limits]
cpus = 0.5
memory = "64m"
pids = 32
max_output = "1m"
timeout = 9
"""
    )
    defaults, _ = defaults_from_args(batch_args("--profile", str(profile), "--memory", "128MB"))
    lines = (
        b'{"id": 1, "command": ["true"]}\n'
        b'{"id": 2, "command": ["true"], "image": "other:1", "limits": {"timeout": 3}}\n'
    )
    first, second = (job.spec.spec for job in decode_jobs(lines, defaults=defaults))  # checked
    assert first.image == IMAGE
    assert first.env == {"FROM": "profile"}
    assert first.limits.memory_bytes == 128 * MiB  # the flag over the profile
    assert first.limits.timeout_s == 9
    assert second.image == "other:1"  # the line over both
    assert second.limits.timeout_s == 3
    assert second.limits.memory_bytes == 128 * MiB


def test_a_bad_default_flag_names_the_flag() -> None:
    with pytest.raises(SpecError) as caught:
        defaults_from_args(batch_args("--memory", "64"))
    assert caught.value.field == "--memory"


def test_without_error_lines_keeps_everything_else() -> None:
    data = (
        b'{"id": "a", "status": "error"}\n'
        b'{"id": "b", "status": "exited"}\n'
        b'{"id": "c", "status": "error"}\n'
        b'{"id": "d"'  # a crash's fragment stays for prepare_results to judge
    )
    kept, dropped = without_error_lines(data, {"a", "b"})
    assert dropped == 1
    assert kept == b'{"id": "b", "status": "exited"}\n{"id": "c", "status": "error"}\n{"id": "d"'


def test_forget_error_lines_rewrites_the_file(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_bytes(b'{"id": 1, "status": "error"}\n{"id": 2, "status": "exited"}\n')
    assert forget_error_lines(out, {1, 2}) == 1
    assert out.read_bytes() == b'{"id": 2, "status": "exited"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
    assert forget_error_lines(tmp_path / "absent.jsonl", {1}) == 0
