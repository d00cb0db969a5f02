"""Property (issue 12, "Done when"): arbitrary text and numbers in every flag of ``run``,
``shell`` and ``batch``, in every profile field and in a job line's fields, end in exit 2 with a
message — never a traceback, never a container.

``sbxkit``'s ``main`` runs in-process against a socket path that does not exist. Exit 2 is a
refusal; an input that is valid goes on to the engine and ends there as 69 (engine
unavailable), or for ``batch`` as 1 (each job's error line). So no container can exist, and
the test proves the refusal happens before any engine contact: a refused input never shows
69. Anything but ``SystemExit`` escaping ``main`` is a traceback, and fails the property.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sbxkit._grammar.common import Parser
from sbxkit._grammar.profile import load_profile, profile_from_dict
from sbxkit._plan.policy import build_create_body
from sbxkit.cli import EXIT_ENGINE_UNAVAILABLE, EXIT_REFUSED, build_parser, main, spec_from_args
from sbxkit.errors import SpecError

NO_SOCKET = "/nonexistent/sbxkit-fuzz.sock"
IMAGE = "sbxkit-test/busybox:latest"
ACCEPTED_RUN = {EXIT_REFUSED, EXIT_ENGINE_UNAVAILABLE}
ACCEPTED_BATCH = {EXIT_REFUSED, EXIT_ENGINE_UNAVAILABLE, 1}
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_N", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# What a command line can carry: any text without NUL, including the lone surrogates that
# undecodable bytes become (PEP 383), and numbers written every way Python would print them.
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.0f}"),
    st.sampled_from(["0", "-1", "1e300", "1e-300", "١٢", "٣", "²", "６４m", "1_0", " 1 ", "0x10"]),
)
argv_text = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=20).map(os.fsdecode),
    numbers,
    numbers.map(lambda n: n + "m"),
).filter(lambda s: "\0" not in s)

RUN_VALUE_FLAGS = [
    "--cpus",
    "--memory",
    "--pids",
    "--max-output",
    "--timeout",
    "--fsize",
    "--scratch",
    "--env",
    "--user",
    "--workdir",
    "--network",
    "--runtime",
    "--label",
    "--gpus",
    "--profile",
    "--pool",
]
SHELL_VALUE_FLAGS = [
    f for f in RUN_VALUE_FLAGS if f not in ("--runtime", "--label", "--gpus", "--pool")
]
BATCH_VALUE_FLAGS = [
    "--parallel",
    "--memory-budget",
    "--cpu-budget",
    "--image",
    "--cpus",
    "--memory",
    "--pids",
    "--max-output",
    "--timeout",
    "--fsize",
    "--scratch",
    "--profile",
]


@contextmanager
def captured() -> Iterator[io.BytesIO]:
    """stdout and stderr as the real ones behave (bytes underneath; stderr escapes what is
    not UTF-8), both into one buffer."""
    buffer = io.BytesIO()
    out = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(buffer, encoding="utf-8", errors="backslashreplace", write_through=True)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield buffer
    finally:
        sys.stdout, sys.stderr = saved
        out.detach()  # a collected wrapper would close the buffer under the caller
        err.detach()


def exit_of(argv: list[str]) -> tuple[int, str]:
    """``sbxkit ARGV`` in-process: its exit status and everything it printed."""
    try:
        with captured() as buffer, pytest.raises(SystemExit) as stopped:
            main(argv)
    finally:
        Parser.json_errors = False  # main sets it from argv; leave no state to later tests
    code = stopped.value.code
    assert isinstance(code, int)
    return code, buffer.getvalue().decode("utf-8", "replace")


def assert_clean(code: int, printed: str, accepted: set[int]) -> None:
    assert code in accepted, printed
    assert "Traceback" not in printed
    if code == EXIT_REFUSED:
        assert "error:" in printed, printed  # the refusal says what and why


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SBXKIT_SOCKET", "DOCKER_HOST"):
        monkeypatch.setenv(name, f"unix://{NO_SOCKET}" if name == "DOCKER_HOST" else NO_SOCKET)


def assert_sendable(argv: list[str]) -> None:
    """What the run accepted (it reached the engine) encodes as the create body it would
    send: an accepted input that cannot be sent would fail after engine contact."""
    args = build_parser().parse_args(argv)
    profile = load_profile(args.profile) if args.profile is not None else None
    spec = spec_from_args(args, profile)
    count = spec.gpus.count if spec.gpus is not None and spec.gpus.devices is None else None
    devices = None if count is None else [f"nvidia.com/gpu={i}" for i in range(count)]
    msgspec.json.encode(build_create_body(spec, "0" * 32, gpu_devices=devices))


@FUZZ
@given(flag=st.sampled_from(RUN_VALUE_FLAGS), value=argv_text, json_out=st.booleans())
@example(flag="--env", value="\udcff", json_out=True)  # a field that is not UTF-8, as JSON
@example(flag="--workdir", value="/\udcff", json_out=False)  # not sendable, once accepted
def test_every_run_flag(flag: str, value: str, json_out: bool) -> None:
    argv = ["run", "--socket", NO_SOCKET, *(["--json"] if json_out else []), flag, value]
    argv += [IMAGE, "--", "true"]
    code, printed = exit_of(argv)
    assert_clean(code, printed, ACCEPTED_RUN)
    if code == EXIT_ENGINE_UNAVAILABLE:
        assert_sendable(argv)


@FUZZ
@given(image=argv_text, command=st.lists(argv_text, max_size=3))
def test_run_image_and_command(image: str, command: list[str]) -> None:
    argv = ["run", "--socket", NO_SOCKET, "--", image, "--", *command]
    code, printed = exit_of(argv)
    assert_clean(code, printed, ACCEPTED_RUN)
    if code == EXIT_ENGINE_UNAVAILABLE:
        assert_sendable(argv)


@FUZZ
@given(flag=st.sampled_from(SHELL_VALUE_FLAGS), value=argv_text)
def test_every_shell_flag(flag: str, value: str) -> None:
    code, printed = exit_of(["shell", "--socket", NO_SOCKET, flag, value, IMAGE])
    assert_clean(code, printed, ACCEPTED_RUN)


@pytest.fixture(scope="module")
def jobs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "jobs.jsonl"
    path.write_text(json.dumps({"id": 1, "image": IMAGE, "command": ["true"]}) + "\n")
    return path


@FUZZ
@given(flag=st.sampled_from(BATCH_VALUE_FLAGS), value=argv_text)
def test_every_batch_flag(flag: str, value: str, jobs_file: Path, tmp_path: Path) -> None:
    out = tmp_path / f"out-{os.getpid()}.jsonl"
    out.unlink(missing_ok=True)
    code, printed = exit_of(
        ["batch", "--socket", NO_SOCKET, "--out", str(out), flag, value, str(jobs_file)]
    )
    assert_clean(code, printed, ACCEPTED_BATCH)


# --- profile fields and job lines: any JSON-like value in any field ------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(),
        st.text(max_size=30),
        numbers,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)

PROFILE_FIELDS = [
    ("image",),
    ("user",),
    ("runtime",),
    ("network",),
    ("workdir",),
    ("env",),
    ("labels",),
    ("extra_flags",),
    ("enable_bind_mounts",),
    ("enable_named_volumes",),
    ("mounts",),
    ("gpus",),
    ("limits", "cpus"),
    ("limits", "memory"),
    ("limits", "pids"),
    ("limits", "max_output"),
    ("limits", "timeout"),
    ("limits", "fsize"),
    ("limits", "scratch"),
    ("supervisor", "binary"),
    ("supervisor", "state_dir"),
]


def profile_with(path: tuple[str, ...], value: object) -> dict[str, Any]:
    docker: dict[str, Any] = {"image": IMAGE}
    table = docker
    for key in path[:-1]:
        table = table.setdefault(key, {})
    table[path[-1]] = value
    return {"sandbox": {"docker": docker}}


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(PROFILE_FIELDS), value=json_values)
def test_every_profile_field_is_refused_only_as_a_spec_error(
    path: tuple[str, ...], value: object
) -> None:
    try:
        profile_from_dict(profile_with(path, value))
    except SpecError as error:
        refused: SpecError | None = error
    else:
        refused = None
    assert refused is None or (refused.field and refused.rule)


def toml_value(value: object) -> str:
    """``value`` as TOML (strings JSON-escaped; TOML's basic strings read the same escapes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(items) + "}"
    return '""'


@FUZZ
@given(path=st.sampled_from(PROFILE_FIELDS), value=json_values.filter(lambda v: v is not None))
def test_every_profile_field_through_the_cli(
    path: tuple[str, ...], value: object, tmp_path: Path
) -> None:
    table = ".".join(("sandbox", "docker", *path[:-1]))
    text = f'[sandbox.docker]\nimage = "{IMAGE}"\n'
    if len(path) > 1:
        text += f"[{table}]\n"
    text += f"{json.dumps(path[-1])} = {toml_value(value)}\n"
    profile = tmp_path / "profile.toml"
    profile.write_text(text)
    code, printed = exit_of(["run", "--socket", NO_SOCKET, "--profile", str(profile), "--", "true"])
    assert_clean(code, printed, ACCEPTED_RUN)


JOB_FIELDS = ["id", "image", "command", "env", "user", "workdir", "labels", "stdin", "limits"]


@FUZZ
@given(field=st.sampled_from(JOB_FIELDS), value=json_values)
def test_every_job_field(field: str, value: object, tmp_path: Path) -> None:
    job: dict[str, object] = {"id": "j", "image": IMAGE, "command": ["true"], field: value}
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(job) + "\n")
    out = tmp_path / "out.jsonl"
    out.unlink(missing_ok=True)
    code, printed = exit_of(["batch", "--socket", NO_SOCKET, "--out", str(out), str(jobs)])
    assert_clean(code, printed, ACCEPTED_BATCH)
