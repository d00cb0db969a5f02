"""Bad input refused cleanly (issue 12, items 3 and 4): every refusal a SpecError naming the
field, before any container exists; no UnicodeEncodeError, OverflowError, RecursionError or
AttributeError escapes. Pure: the rules themselves, and the CLI run as a subprocess against a
socket that does not exist (exit 2 is the refusal; 69, engine unavailable, would mean the
input was accepted and the engine contacted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from sbxkit._consumers.runner import run as runner_run
from sbxkit._grammar.daemon_refusal import is_daemon_refusal
from sbxkit._grammar.profile import decode_profile, profile_from_dict
from sbxkit._model.call_checks import check_spec_type, check_stdin
from sbxkit._model.image_ref import image_reference_problem
from sbxkit._model.spec import (
    MAX_ID,
    Limits,
    MiB,
    SandboxSpec,
    check_limit,
    parse_user,
    validate_image,
    validate_spec,
    validate_workdir,
)
from sbxkit._model.textcheck import check_utf8
from sbxkit.cli import EXIT_INTERNAL, EXIT_REFUSED, exit_code_for_error
from sbxkit.errors import Conflict, EngineError, SpecError, SupervisorError, scrub_daemon_paths

IMAGE = "sbxkit-test/busybox:latest"
NO_SOCKET = "/nonexistent/sbxkit-test.sock"
LIMITS = Limits(cpus=1, memory_bytes=64 * MiB, pids=32, output_bytes=MiB, timeout_s=10)


def spec(**fields: object) -> SandboxSpec:
    base: dict[str, object] = {"image": IMAGE, "command": ["true"], "limits": LIMITS}
    return SandboxSpec(**{**base, **fields})  # type: ignore[arg-type]


def refusal(make: object, *args: object) -> SpecError:
    assert callable(make)
    with pytest.raises(SpecError) as caught:
        make(*args)
    return caught.value


def cli(*argv: str | bytes, close_stdout: bool = False) -> subprocess.CompletedProcess[bytes]:
    """``python -m sbxkit ARGV`` with bytes argv (not UTF-8 on purpose), no engine."""
    env = {**os.environ, "SBXKIT_SOCKET": NO_SOCKET, "DOCKER_HOST": f"unix://{NO_SOCKET}"}
    command = [sys.executable.encode(), b"-m", b"sbxkit", *map(os.fsencode, argv)]
    return subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if close_stdout else subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        timeout=60,
        check=False,
        preexec_fn=(lambda: os.close(1)) if close_stdout else None,
    )


# --- item 3: non-UTF-8, surrogates, overflow, types, nesting, closed stdout -----------------


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ([IMAGE, "--", "echo", b"\xff"], "CMD[1]"),
        (["--env", b"K=\xff", IMAGE, "--", "true"], "--env['K']"),
        (["--label", b"\xfe=v", IMAGE, "--", "true"], "--label['\\udcfe'] (key)"),
        (["--workdir", b"/w\xff", IMAGE, "--", "true"], "--workdir"),
    ],
)
def test_non_utf8_bytes_in_argv_are_refused_naming_the_field(
    flags: list[str | bytes], field: str
) -> None:
    done = cli("run", "--socket", NO_SOCKET, *flags)
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert f"sbxkit: error: {field}: must be valid UTF-8".encode() in done.stderr
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": ["echo", "\ud800"]}, "command[1]"),
        ({"env": {"K": "a\udfff"}}, "env['K']"),
        ({"labels": {"k": "\udcff"}}, "labels['k']"),
        ({"user": "\ud800"}, "user"),
        ({"extra_flags": ["--label=a=\ud800"]}, "extra_flags[0]"),
    ],
)
def test_lone_surrogates_through_the_api_are_refused(fields: dict[str, object], field: str) -> None:
    error = refusal(validate_spec, spec(**fields))
    assert error.field == field
    assert error.rule.startswith("must be valid UTF-8 text")


def test_check_utf8_names_nested_paths_and_bounds_depth() -> None:
    assert refusal(check_utf8, {"a": [1, {"b": "\udc80"}]}, "x").field == "x['a'][1]['b']"
    nested: list[object] = []
    for _ in range(100):
        nested = [nested]
    assert "nested more than" in refusal(check_utf8, nested, "deep").rule


def test_an_int_beyond_float_range_is_a_spec_error_not_overflow() -> None:
    error = refusal(validate_spec, spec(limits=msgspec.structs.replace(LIMITS, timeout_s=10**400)))
    assert error.field == "limits.timeout_s"
    assert "finite" in error.rule
    assert refusal(check_limit, "cpus", 10**400).field == "limits.cpus"


@pytest.mark.parametrize(
    "bad",
    [
        {"image": None},
        {"image": 5},
        {"command": "ls"},
        {"command": [b"ls"]},
        {"env": [("K", "V")]},
        {"env": {"K": 1}},
        {"labels": None},
        {"user": 65534},
        {"workdir": 7},
        {"network": None},
        {"runtime": 1.5},
        {"mounts": "x"},
        {"extra_flags": "--label=a=b"},
        {"limits": {"cpus": 1}},
    ],
)
def test_wrong_python_types_are_spec_errors(bad: dict[str, object]) -> None:
    error = refusal(validate_spec, spec(**bad))
    assert error.field.split("[")[0].split(".")[0] == next(iter(bad))


def test_a_spec_that_is_not_a_spec_is_refused() -> None:
    assert refusal(validate_spec, {"image": IMAGE}).field == "spec"
    assert refusal(check_spec_type, None, SandboxSpec).field == "spec"
    check_spec_type(spec(), SandboxSpec)


def test_stdin_must_be_bytes_or_none() -> None:
    check_stdin(None)
    check_stdin(b"x")
    check_stdin(bytearray(b"x"))
    error = refusal(check_stdin, "text")
    assert (error.field, "encode it" in error.rule) == ("stdin", True)
    assert "got int" in refusal(check_stdin, 5).rule


@pytest.mark.parametrize("stdin", ["text", 5, ["a"]])
async def test_a_run_refuses_a_wrong_stdin_before_the_engine(stdin: object) -> None:
    """The socket does not exist: a refusal that came after engine contact would be
    EngineUnavailable, not SpecError."""
    import sbxkit

    spec = sbxkit.SandboxSpec(
        image="sbxkit-test/busybox:latest",
        command=["true"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=64 * sbxkit.MiB, pids=64, output_bytes=1024, timeout_s=5
        ),
    )
    for call in (sbxkit.run, runner_run):
        with pytest.raises(SpecError) as caught:
            await call(spec, stdin, socket_path="/nonexistent/docker.sock")  # type: ignore[arg-type]
        assert caught.value.field == "stdin"


def test_a_deeply_nested_profile_is_a_spec_error() -> None:
    error = refusal(decode_profile, "x = " + "[" * 50_000 + "]" * 50_000, "profile p.toml")
    assert error.field == "profile p.toml"
    assert "too deeply" in error.rule
    assert refusal(profile_from_dict, {"sandbox": {"docker": {"env": {"K": "\udcff"}}}}).field


def test_a_closed_stdout_is_refused_before_anything_runs() -> None:
    done = cli("run", "--socket", NO_SOCKET, IMAGE, "--", "true", close_stdout=True)
    assert done.returncode == EXIT_REFUSED
    assert b"sbxkit: error: stdout: is closed" in done.stderr
    assert b"Traceback" not in done.stderr


# --- item 4: what the daemon or runc would refuse after create --------------------------------


def test_ids_are_within_runcs_range() -> None:
    assert MAX_ID == 2**31 - 1
    assert parse_user(f"{MAX_ID}:{MAX_ID}") == (MAX_ID, MAX_ID)
    for user in (f"{MAX_ID + 1}:1", "4294967294:1", f"1:{2**32 - 2}"):
        assert "1..2147483647" in refusal(parse_user, user).rule


@pytest.mark.parametrize(
    "workdir",
    [
        "/dev/null",
        "/dev",
        "/proc/foo",
        "/proc",
        "/sys/fs",
        "/a/../proc/self",
        "//sys",
        "/./dev/./shm",
        "/" + "a" * 256,
        "/" + "/".join(["a" * 200] * 6),
    ],
)
def test_workdirs_the_runtime_cannot_use_are_refused(workdir: str) -> None:
    assert refusal(validate_workdir, workdir).field == "workdir"


@pytest.mark.parametrize("workdir", ["/", "/tmp/x", "/work/deep/a", "/devices", "/" + "a" * 255])
def test_ordinary_workdirs_pass(workdir: str) -> None:
    validate_workdir(workdir)


@pytest.mark.parametrize(
    "image",
    [
        "HIDDEN/busybox:1",
        "busybox:",
        "a@b@c",
        "hidden//busybox:1",
        "LOCALHOST/x",
        "a._b",
        "-a",
        "x:" + "t" * 129,
        "x" * 238,  # docker.io/library/ counts: 255 in all
        "busybox@sha256:abc",
        "busybox@md5:" + "0" * 32,
        "../x",
    ],
)
def test_image_references_the_daemon_refuses_are_refused(image: str) -> None:
    assert refusal(validate_image, image).field == "image"


@pytest.mark.parametrize(
    "image",
    [
        IMAGE,
        "busybox",
        "MyReg.io/x:1",
        "localhost:5000/a/b:c",
        "a__b/c-d---e",
        "x:" + "t" * 128,
        "x" * 237,
        "sha256:abc",  # repository "sha256", tag "abc" in Docker's grammar too
        "f" * 64,
        "busybox:1@sha256:" + "0" * 64,
    ],
)
def test_image_references_the_daemon_accepts_pass(image: str) -> None:
    assert image_reference_problem(image) is None


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("timeout_s", 1e300, False),
        ("timeout_s", 30 * 24 * 3600 + 1, False),
        ("timeout_s", 30 * 24 * 3600, True),
        ("timeout_s", 1e-300, False),
        ("timeout_s", 0.001, True),
        ("output_bytes", 1024 * MiB + 1, False),
        ("output_bytes", 1024 * MiB, True),
        ("memory_bytes", 2**40 + 1, False),
        ("memory_bytes", 2**40, True),
        ("scratch_bytes", 2**62, False),
        ("fsize_bytes", 2**63 - 1, False),
        ("pids", 4_194_305, False),
        ("cpus", 1024.5, False),
    ],
)
def test_absurd_finite_limits_are_out_of_range(name: str, value: float, ok: bool) -> None:
    if ok:
        check_limit(name, value)
    else:
        assert refusal(check_limit, name, value).field == f"limits.{name}"


@pytest.mark.parametrize(
    "flags",
    [
        ["--cpus", "١"],
        ["--pids", "١٢"],
        ["--timeout", "٣٠"],
        ["--memory", "６４m"],
        ["--timeout", "1_0"],
        ["--timeout", "1e300"],
        ["--user", "١٠٠٠:١٠٠٠"],
        ["--gpus", "²"],
    ],
)
def test_numbers_are_ascii_digits_only(flags: list[str]) -> None:
    done = cli("run", "--socket", NO_SOCKET, *flags, IMAGE, "--", "true")
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert done.stderr.startswith(b"sbxkit: error: ")


def test_non_ascii_digits_in_batch_flags_are_usage_errors(tmp_path: Path) -> None:
    done = cli("batch", "--parallel", "٣", str(tmp_path / "j"), "--out", str(tmp_path / "o"))
    assert done.returncode == EXIT_REFUSED
    assert b"not an integer" in done.stderr


# --- the daemon's refusals: exit 2, and no data-root paths --------------------------------------

CREATE = "/v1.41/containers/create?name=sbxkit-0123"


def test_a_4xx_on_create_is_refused_input() -> None:
    assert exit_code_for_error(EngineError("POST", CREATE, 400, "bad")) == EXIT_REFUSED
    assert exit_code_for_error(EngineError("POST", CREATE, 500, "bad")) == EXIT_INTERNAL
    assert exit_code_for_error(Conflict("POST", CREATE, 409, "name in use")) == EXIT_INTERNAL
    start = "/v1.41/containers/abc/start"
    assert exit_code_for_error(EngineError("POST", start, 400, "x")) == EXIT_INTERNAL
    through_supervisor = SupervisorError(
        f"create failed: POST {CREATE} -> 400: invalid reference format", code="failed"
    )
    assert is_daemon_refusal(through_supervisor)
    assert exit_code_for_error(through_supervisor) == EXIT_REFUSED
    uncertain = SupervisorError(f"create outcome uncertain (POST {CREATE} -> 400: x)")
    assert exit_code_for_error(uncertain) == EXIT_INTERNAL


def test_daemon_paths_never_reach_a_message() -> None:
    rootfs = "/var/lib/docker/overlay2/" + "ab" * 32 + "/merged"
    error = EngineError("POST", CREATE, 500, f"lstat {rootfs}/aaaa: file name too long")
    assert "/var/lib/docker" not in str(error)
    assert "lstat /aaaa: file name too long" in str(error)
    other = scrub_daemon_paths("open /srv/docker/containers/" + "cd" * 32 + "/config.v2.json: x")
    assert other == "open <daemon>/" + "cd" * 6 + "/config.v2.json: x"
    assert scrub_daemon_paths("Cannot mkdir: /etc/passwd is not a directory") == (
        "Cannot mkdir: /etc/passwd is not a directory"
    )
    # Docker 26, a volume subpath the volume lacks (tests/engine/test_mounts.py shows it live).
    data = "/var/lib/docker/volumes/my_vol.1/_data"
    missing = f"cannot access path {data}/missing: lstat {data}/missing: no such file or directory"
    assert scrub_daemon_paths(missing) == (
        "cannot access path volume my_vol.1/missing: "
        "lstat volume my_vol.1/missing: no such file or directory"
    )
    assert scrub_daemon_paths(f"mount {data}: x") == "mount volume my_vol.1: x"
