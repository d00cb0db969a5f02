"""The ``sbxkit run`` command line: flags to spec, results and errors to exit codes and JSON.

No daemon: every path here ends before a container would be created.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import pytest

from sbxkit._grammar.flags import DEFAULTS
from sbxkit._model.result import PhaseTimings, RunResult, Status
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.cli import (
    EXIT_CLEANUP_FAILED,
    EXIT_ENGINE_UNAVAILABLE,
    EXIT_INTERNAL,
    EXIT_OOM_KILLED,
    EXIT_OUTPUT_EXCEEDED,
    EXIT_REFUSED,
    EXIT_TIMED_OUT,
    build_parser,
    exit_code_for,
    exit_code_for_error,
    main,
    spec_from_args,
    to_json,
)
from sbxkit.errors import (
    CleanupError,
    ContainerMismatch,
    EngineConnectionError,
    EngineError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    ImageError,
    NotFound,
    SbxError,
    SpecError,
)

IMAGE = "sbxkit-test/busybox:latest"


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def spec_of(*argv: str) -> SandboxSpec:
    return spec_from_args(parse(*argv))


# -- flags to spec --------------------------------------------------------------------------------


def test_defaults() -> None:
    spec = spec_of(IMAGE, "--", "echo", "hi")
    assert spec.image == IMAGE
    assert spec.command == ["echo", "hi"]
    assert spec.limits == Limits(
        cpus=1.0,
        memory_bytes=256 * MiB,
        pids=128,
        output_bytes=MiB,
        timeout_s=30.0,
        fsize_bytes=64 * MiB,
        scratch_bytes=64 * MiB,
    )
    assert spec.env == {}
    assert spec.user is None  # a uid of the sandbox's own, chosen when it is planned
    assert spec.workdir is None
    assert spec.runtime is None
    assert spec.network == "none"
    assert spec.labels == {}
    args = parse(IMAGE, "true")
    assert args.socket is None
    assert args.json is False
    assert args.stdin is None
    assert DEFAULTS == {
        "cpus": "1",
        "memory": "256m",
        "pids": "128",
        "max_output": "1m",
        "timeout": "30",
    }


def test_every_flag_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBXKIT_TEST_PASSED", "from host")
    args = parse(
        "--cpus",
        "0.5",
        "--memory",
        "64MiB",
        "--pids",
        "32",
        "--max-output",
        "4k",
        "--timeout",
        "2.5",
        "--fsize",
        "1g",
        "--scratch",
        "16m",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "--env",
        "EMPTY=",
        "--env",
        "SBXKIT_TEST_PASSED",
        "--stdin",
        "-",
        "--user",
        "1000:1000",
        "--workdir",
        "/tmp",
        "--runtime",
        "crun",
        "--socket",
        "/run/other.sock",
        "--json",
        IMAGE,
        "--",
        "sh",
        "-c",
        "echo $A",
    )
    assert args.stdin == "-"
    assert args.socket == "/run/other.sock"
    assert args.json is True
    spec = spec_from_args(args)
    assert spec.limits == Limits(
        cpus=0.5,
        memory_bytes=64 * MiB,
        pids=32,
        output_bytes=4096,
        timeout_s=2.5,
        fsize_bytes=1024 * MiB,
        scratch_bytes=16 * MiB,
    )
    assert spec.env == {"A": "1", "B": "x=y", "EMPTY": "", "SBXKIT_TEST_PASSED": "from host"}
    assert spec.user == "1000:1000"
    assert spec.workdir == "/tmp"
    assert spec.runtime == "crun"
    assert spec.command == ["sh", "-c", "echo $A"]


@pytest.mark.parametrize(
    ("flag", "text", "field", "value"),
    [
        ("--memory", "8388608", "memory_bytes", 8 * MiB),
        ("--scratch", "512K", "scratch_bytes", 512 * 1024),
        ("--memory", "2GiB", "memory_bytes", 2 * 1024 * MiB),
        ("--memory", "64mb", "memory_bytes", 64 * MiB),
        ("--memory", "512MB", "memory_bytes", 512 * MiB),
        ("--max-output", "1kib", "output_bytes", 1024),
        ("--fsize", "3m", "fsize_bytes", 3 * MiB),
        ("--scratch", "100", "scratch_bytes", 100),
    ],
)
def test_sizes_use_parse_size(flag: str, text: str, field: str, value: int) -> None:
    assert getattr(spec_of(flag, text, IMAGE, "true").limits, field) == value


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--memory", "1.5x"], "--memory"),
        (["--memory", "10"], "--memory"),  # 10 bytes: below Docker's minimum
        (["--max-output", "0b"], "--max-output"),
        (["--memory", "-1"], "--memory"),
        (["--max-output", "lots"], "--max-output"),
        (["--scratch", "1.5t"], "--scratch"),  # over 1 TiB
        (["--cpus", "two"], "--cpus"),
        (["--pids", "1.5"], "--pids"),
        (["--pids", "many"], "--pids"),
        (["--timeout", "soon"], "--timeout"),
    ],
)
def test_bad_values_are_spec_errors_naming_the_flag(argv: list[str], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(*argv, IMAGE, "true")
    assert caught.value.field == field


@pytest.mark.parametrize("flag", ["--fsize", "--scratch"])
def test_empty_optional_size_is_refused(flag: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(flag, "", IMAGE, "true")
    assert caught.value.field == flag


def test_empty_mandatory_size_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        spec_of("--memory", "", IMAGE, "true")
    assert caught.value.field == "--memory"


def test_numbers_accept_what_python_accepts() -> None:
    spec = spec_of("--cpus", "1e-1", "--timeout", "1e3", "--pids", " 7 ", IMAGE, "true")
    assert spec.limits.cpus == pytest.approx(0.1)
    assert spec.limits.timeout_s == 1000.0
    assert spec.limits.pids == 7


def test_bare_env_takes_the_host_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBXKIT_TEST_TOKEN", "s3cret")
    monkeypatch.setenv("SBXKIT_TEST_OTHER", "never passed")
    spec = spec_of("--env", "SBXKIT_TEST_TOKEN", IMAGE, "true")
    assert spec.env == {"SBXKIT_TEST_TOKEN": "s3cret"}  # nothing else from the host


def test_bare_env_of_an_unset_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SBXKIT_TEST_UNSET", raising=False)
    with pytest.raises(SpecError) as caught:
        spec_of("--env", "SBXKIT_TEST_UNSET", IMAGE, "true")
    assert caught.value.field == "--env SBXKIT_TEST_UNSET"
    assert "unset" in caught.value.rule


def test_bare_env_set_to_empty_is_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBXKIT_TEST_EMPTY", "")
    assert spec_of("--env", "SBXKIT_TEST_EMPTY", IMAGE, "true").env == {"SBXKIT_TEST_EMPTY": ""}


def test_repeated_env_last_wins() -> None:
    assert spec_of("--env", "K=1", "--env", "K=2", IMAGE, "true").env == {"K": "2"}


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([IMAGE, "--", "echo", "hi"], ["echo", "hi"]),
        ([IMAGE, "echo", "hi"], ["echo", "hi"]),
        ([IMAGE, "--", "ls", "-la", "--color"], ["ls", "-la", "--color"]),
        # Everything after IMAGE belongs to the command, flags included.
        ([IMAGE, "echo", "--cpus", "2"], ["echo", "--cpus", "2"]),
        ([IMAGE, "--", "echo", "--", "x"], ["echo", "--", "x"]),
        ([IMAGE], []),
    ],
)
def test_command_after_image(argv: list[str], command: list[str]) -> None:
    spec = spec_of(*argv)
    assert spec.command == command
    assert spec.limits.cpus == 1.0


def test_leading_double_dash_is_stripped_from_the_namespace() -> None:
    """Whether or not argparse already removed it, one leading ``--`` never reaches the
    container as the program name."""
    args = parse(IMAGE, "true")
    args.command = ["--", "echo", "hi"]
    assert spec_from_args(args).command == ["echo", "hi"]


def test_a_flag_after_the_image_without_a_separator_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Never run as the payload (issue 25; tests/unit/test_flag_placement.py for the rest)."""
    with pytest.raises(SystemExit) as caught:
        spec_of(IMAGE, "--memory", "1g")
    assert caught.value.code == 2
    assert "--memory after IMAGE would be the command" in capsys.readouterr().err


def test_missing_image_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["run"])
    assert caught.value.code == 2
    assert "IMAGE" in capsys.readouterr().err


def test_main_refuses_bad_flags_before_any_daemon_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A socket that does not exist: reaching the daemon would be EXIT_ENGINE_UNAVAILABLE.
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--cpus", "lots", IMAGE, "--", "true"])
    assert caught.value.code == EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.startswith("sbxkit: error: --cpus: ")


def test_main_refuses_invalid_spec_before_any_daemon_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--user", "0:0", IMAGE, "--", "true"])
    assert caught.value.code == EXIT_REFUSED
    assert "root" in capsys.readouterr().err


def test_main_reports_a_missing_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", IMAGE, "--", "true"])
    assert caught.value.code == EXIT_ENGINE_UNAVAILABLE
    assert "/nonexistent/d.sock" in capsys.readouterr().err


# -- results to exit codes ----------------------------------------------------------------------


def result(status: Status, exit_code: int | None, **fields: Any) -> RunResult:
    values: dict[str, Any] = {
        "status": status,
        "exit_code": exit_code,
        "stdout": b"",
        "stderr": b"",
        "overflowed": None,
        "container_id": "c" * 64,
        "lease": "l" * 32,
        "timings": PhaseTimings(create_s=0.01, start_s=0.2, run_s=0.05, remove_s=0.006),
        **fields,
    }
    return RunResult(**values)


@pytest.mark.parametrize("code", [0, 1, 2, 17, 123, 124, 126, 127, 137, 255])
def test_exited_passes_the_payload_code(code: int) -> None:
    assert exit_code_for(result("exited", code)) == code


@pytest.mark.parametrize(
    ("status", "exit_code", "expected"),
    [
        ("exited", None, EXIT_INTERNAL),
        ("timed_out", None, EXIT_TIMED_OUT),
        ("output_exceeded", None, EXIT_OUTPUT_EXCEEDED),
        ("output_exceeded", 0, EXIT_OUTPUT_EXCEEDED),
        ("oom_killed", 137, EXIT_OOM_KILLED),
        ("oom_killed", None, EXIT_OOM_KILLED),
    ],
)
def test_status_exit_codes(status: Status, exit_code: int | None, expected: int) -> None:
    assert exit_code_for(result(status, exit_code)) == expected


def test_exit_code_constants_match_the_documentation() -> None:
    assert (EXIT_TIMED_OUT, EXIT_OUTPUT_EXCEEDED, EXIT_OOM_KILLED) == (124, 123, 137)
    assert (EXIT_REFUSED, EXIT_ENGINE_UNAVAILABLE, EXIT_INTERNAL, EXIT_CLEANUP_FAILED) == (
        2,
        69,
        70,
        74,
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (SpecError("limits.cpus", "mandatory"), EXIT_REFUSED),
        (ImageError("x", "not present locally"), EXIT_REFUSED),
        (EngineUnavailable("/var/run/docker.sock", "no such socket"), EXIT_ENGINE_UNAVAILABLE),
        (CleanupError("lease", "c" * 64, "timeout"), EXIT_CLEANUP_FAILED),
        (CleanupError("lease", None, "timeout"), EXIT_CLEANUP_FAILED),
        (EngineError("GET", "/x", 500, "boom"), EXIT_INTERNAL),
        (NotFound("GET", "/x", 404, "gone"), EXIT_INTERNAL),
        (EngineTimeout("GET", "/x", 1.0), EXIT_INTERNAL),
        (EngineConnectionError("GET", "/x", "reset"), EXIT_INTERNAL),
        (EngineProtocolError("garbage"), EXIT_INTERNAL),
        (ContainerMismatch("c" * 64, "HostConfig.Memory"), EXIT_INTERNAL),
        (SbxError("anything else"), EXIT_INTERNAL),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_exit_code_for_error(error: SbxError, code: int) -> None:
    assert exit_code_for_error(error) == code


# -- --json -------------------------------------------------------------------------------------

JSON_KEYS = {
    "status",
    "exit_code",
    "stdout",
    "stderr",
    "stdout_bytes",
    "stderr_bytes",
    "overflowed",
    "container_id",
    "lease",
    "oom_evidence",
    "kill_evidence",
    "usage",
    "timings",
    "pooled",
    "evidence",
    "denials",
    "ports",
    "error",
}


def test_json_has_the_documented_keys() -> None:
    doc = msgspec.json.decode(to_json(result("exited", 17, stdout=b"hi\n")))
    assert set(doc) == JSON_KEYS
    assert doc["status"] == "exited"
    assert doc["exit_code"] == 17
    assert doc["stdout"] == "hi\n"
    assert doc["stdout_bytes"] == 3
    assert doc["stderr"] == ""
    assert doc["stderr_bytes"] == 0
    assert doc["overflowed"] is None
    assert doc["container_id"] == "c" * 64
    assert doc["lease"] == "l" * 32
    assert doc["oom_evidence"] is None
    assert doc["timings"] == {
        "queued_s": 0.0,
        "create_s": 0.01,
        "start_s": 0.2,
        "run_s": 0.05,
        "remove_s": 0.006,
    }


def test_json_decodes_utf8_with_replacement_and_counts_raw_bytes() -> None:
    stdout = "é✓".encode() + b"\xff\xfe" + b"\x00end"
    stderr = b"\xc3"  # a UTF-8 sequence cut off by the output cap
    doc = msgspec.json.decode(
        to_json(result("output_exceeded", None, stdout=stdout, stderr=stderr, overflowed="stdout"))
    )
    assert doc["stdout"] == "é✓\ufffd\ufffd\x00end"
    assert doc["stdout_bytes"] == len(stdout) == 11
    assert doc["stderr"] == "\ufffd"
    assert doc["stderr_bytes"] == 1
    assert doc["overflowed"] == "stdout"
    assert doc["exit_code"] is None


def test_json_oom_evidence_and_one_line() -> None:
    raw = to_json(result("oom_killed", 137, oom_evidence="State.OOMKilled", stderr=b"Killed\n"))
    assert b"\n" not in raw  # cmd_run appends the one newline
    doc = msgspec.json.decode(raw)
    assert doc["status"] == "oom_killed"
    assert doc["oom_evidence"] == "State.OOMKilled"
    assert doc["exit_code"] == 137


# -- profiles, network, labels, GPUs --------------------------------------------------------------

PROFILE = """
[sandbox.docker]
image = "sbxkit-test/python:latest"
user = "1000:1000"
runtime = "crun"
extra_flags = ["--label=team=ml"]

[sandbox.docker.env]
FROM_PROFILE = "p"
SHARED = "profile"

[sandbox.docker.labels]
owner = "data"

[sandbox.docker.limits]
memory = "128m"
timeout = 5
scratch = "8m"

[sandbox.docker.supervisor]
binary = "/opt/sbx/sbxkit-supervisor"
state_dir = "/var/lib/sbxkit-profile-test/leases"
"""


def write_profile(tmp_path: Any, text: str = PROFILE) -> str:
    path = tmp_path / "profile.toml"
    path.write_text(text)
    return str(path)


def test_a_profile_supplies_defaults_and_flags_override_them(tmp_path: Any) -> None:
    from sbxkit._grammar.profile import load_profile

    path = write_profile(tmp_path)
    args = parse("--profile", path, "--timeout", "9", "--env", "SHARED=cli", "--", "python3", "-V")
    assert args.image is None
    spec = spec_from_args(args, load_profile(path))
    assert spec.image == "sbxkit-test/python:latest"
    assert spec.command == ["python3", "-V"]
    assert spec.limits == Limits(
        cpus=1.0,  # DEFAULTS: neither the profile nor a flag set it
        memory_bytes=128 * MiB,  # the profile's
        pids=128,
        output_bytes=MiB,
        timeout_s=9.0,  # the flag's, over the profile's 5
        fsize_bytes=64 * MiB,
        scratch_bytes=8 * MiB,
    )
    assert spec.env == {"FROM_PROFILE": "p", "SHARED": "cli"}
    assert spec.user == "1000:1000"
    assert spec.runtime == "crun"
    assert spec.labels == {"owner": "data"}
    assert spec.extra_flags == ["--label=team=ml"]
    override = parse(
        "--profile",
        path,
        "--user",
        "2000:2000",
        "--runtime",
        "runc",
        "--label",
        "owner=cli",
        "other:1",
        "--",
        "true",
    )
    spec = spec_from_args(override, load_profile(path))
    assert (spec.image, spec.user, spec.runtime, spec.command) == (
        "other:1",
        "2000:2000",
        "runc",
        ["true"],
    )
    assert spec.labels == {"owner": "cli"}


def test_without_a_profile_image_an_image_is_still_required(tmp_path: Any) -> None:
    from sbxkit._grammar.profile import load_profile

    path = write_profile(tmp_path, "[sandbox.docker]\n")
    with pytest.raises(SpecError) as caught:
        spec_from_args(parse("--profile", path, "--", "true"), load_profile(path))
    assert caught.value.field == "image"


def test_network_label_and_gpu_flags() -> None:
    from sbxkit._model.gpu import GpuRequest

    spec = spec_of(
        "--network", "bridge", "--label", "a=1", "--label", "b=", "--gpus", "2", IMAGE, "true"
    )
    assert spec.network == "bridge"
    assert spec.labels == {"a": "1", "b": ""}
    assert spec.gpus == GpuRequest(count=2)
    spec = spec_of("--gpus", "nvidia.com/gpu=0, nvidia.com/gpu=1", IMAGE, "true")
    assert spec.gpus == GpuRequest(devices=["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
    with pytest.raises(SpecError) as caught:
        spec_of("--label", "novalue", IMAGE, "true")
    assert caught.value.field == "--label novalue"


def test_host_network_is_not_even_a_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("--network", "host", IMAGE, "true")
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_main_refuses_bridge_in_production_before_any_daemon_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SBXKIT_ENV", "production")
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--network", "bridge", IMAGE, "true"])
    assert caught.value.code == EXIT_REFUSED
    assert "sbxkit: error: --network: bridge networking is refused in production" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("gpus", ["0", "nvidia.com/gpu=0,nvidia.com/gpu=0", "gpu0"])
def test_main_refuses_bad_gpu_requests_before_any_daemon_call(
    gpus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--gpus", gpus, IMAGE, "true"])
    assert caught.value.code == EXIT_REFUSED
    assert "sbxkit: error: --gpus" in capsys.readouterr().err


def test_main_refuses_a_bad_profile(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_profile(tmp_path, "[sandbox.docker]\nlimts = 1\n")
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--profile", path, "--", "true"])
    assert caught.value.code == EXIT_REFUSED
    assert "sandbox.docker.limts: unknown field" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["run", "--profile", str(tmp_path / "missing.toml"), "--", "true"])
    assert caught.value.code == EXIT_REFUSED


def test_main_with_a_profile_passes_the_supervisor_binary_in_the_settings(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The profile's supervisor.binary travels in the Settings the run receives; the process
    environment is left alone (a library caller's os.environ is not ours to change)."""
    import os

    from sbxkit._grammar import run_grammar as run_command
    from sbxkit._lifecycle.launch import supervisor_argv

    monkeypatch.setenv("SBXKIT_SUPERVISOR", "the-callers-own")
    seen: list[Any] = []

    real = run_command.cli_backend

    def recording(profile: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["settings"])
        return real(profile, **kwargs)

    monkeypatch.setattr(run_command, "cli_backend", recording)
    path = write_profile(tmp_path)
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--profile", path, "--", "true"])
    assert caught.value.code == EXIT_ENGINE_UNAVAILABLE
    (settings,) = seen
    assert settings.supervisor_command == "/opt/sbx/sbxkit-supervisor"
    assert os.environ["SBXKIT_SUPERVISOR"] == "the-callers-own"
    state = tmp_path / "leases"
    argv = supervisor_argv(state, settings.supervisor_command)
    assert argv == ["/opt/sbx/sbxkit-supervisor", "--state-dir", str(state)]
    assert supervisor_argv(state)[0] == "the-callers-own"  # without one, the environment's
    assert "/nonexistent/d.sock" in capsys.readouterr().err


def test_an_empty_workdir_is_still_refused_not_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["run", "--socket", "/nonexistent/d.sock", "--workdir", "", IMAGE, "true"])
    assert caught.value.code == EXIT_REFUSED
    assert "workdir: must be an absolute path" in capsys.readouterr().err


def test_the_waiting_notice_speaks_after_a_second_and_when_the_place_changes() -> None:
    import io

    from sbxkit._util.notice import WaitingNotice

    stream = io.StringIO()
    notice = WaitingNotice(stream)
    notice(3, 0.2)  # a short wait says nothing
    notice(3, 1.1)
    notice(3, 2.1)  # same place: said once
    notice(1, 3.1)
    assert stream.getvalue().splitlines() == [
        "sbxkit: waiting for capacity: 3 ahead",
        "sbxkit: waiting for capacity: 1 ahead",
    ]
