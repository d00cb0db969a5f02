"""The ``sbxkit`` command line, run as a real subprocess against the real engine.

The process exit code is the contract scripts rely on; each mapping is checked with a payload
that really produces that outcome. Claims about the daemon go through the witness.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.engine.cli_paths import CliPath
from tests.engine.helpers import (
    actions,
    container_exists,
    delete_image,
    parked_command,
    still_parked,
    tag_image,
    unique,
    wait_until,
)
from tests.supervision import SupervisorProcess, private_state_dir, running_supervisor
from tests.unit.test_cli_args import JSON_KEYS
from tests.witness import Witness

SMALL = ["--cpus", "0.5", "--memory", "64m", "--pids", "64", "--timeout", "20"]


def sbxkit(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    # No stdin: /dev/null, as a terminal user's would be (a pipe needs --stdin).
    return subprocess.run(
        [sys.executable, "-m", "sbxkit", *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def run_cli(
    witness: Witness,
    image: str,
    *command: str,
    options: tuple[str, ...] = (),
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """``sbxkit run SMALL options --socket S image -- command...``."""
    return sbxkit(
        "run",
        *SMALL,
        *options,
        "--socket",
        witness.socket_path,
        image,
        "--",
        *command,
        stdin=stdin,
        env=env,
    )


CliRun = Callable[..., subprocess.CompletedProcess[bytes]]
SHAPELESS = {"--stdin", "--timeout", "--max-output", "--env"}  # not part of a pool's shape


class HeldCli:
    """``run_cli`` claiming from a pool the test's own supervisor holds: a warm-up run of the
    same shape (``true``) starts the pool; once a container is parked, the run claims it; the
    parked container must be gone afterwards (claimed, then removed)."""

    def __init__(self, witness: Witness, supervisor: SupervisorProcess) -> None:
        self.witness = witness
        self.supervisor = supervisor
        self.label = unique("held-cli")

    def parked(self) -> list[str]:
        return [
            c["Id"]
            for c in self.witness.containers(label=self.label)
            if c.get("State") == "running"
            and parked_command(c.get("Command", ""))
            and still_parked(c["Id"])
        ]

    def __call__(
        self,
        witness: Witness,
        image: str,
        *command: str,
        options: tuple[str, ...] = (),
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        pooled = (*options, "--pool", "1", "--label", f"{self.label}=1")
        held_env = {**(env or {}), "SBXKIT_STATE_DIR": str(self.supervisor.state_dir)}
        shape = _without_shapeless(pooled)
        warm = run_cli(witness, image, "true", options=shape, env=held_env)
        assert warm.returncode == 0, warm.stderr
        assert wait_until(lambda: len(self.parked()) == 1, 30.0), self.supervisor.log()
        [waiting] = self.parked()
        proc = run_cli(witness, image, *command, options=pooled, stdin=stdin, env=held_env)
        claimed = wait_until(lambda: not container_exists(witness, waiting), 15.0)
        assert claimed, "the parked container was not claimed"
        if "--json" in options:
            assert one_json_object(proc)["pooled"] is True
        return proc


def _without_shapeless(options: tuple[str, ...]) -> tuple[str, ...]:
    """The flags that decide a pool's shape (each shapeless flag dropped with its value)."""
    kept: list[str] = []
    skip = False
    for option in options:
        if skip:
            skip = False
        elif option in SHAPELESS:
            skip = True
        else:
            kept.append(option)
    return tuple(kept)


@pytest.fixture(params=["cold", "held"])
def cli_run(
    request: pytest.FixtureRequest, witness: Witness, cli_path: CliPath
) -> Iterator[CliRun]:
    """``run_cli`` cold, then claiming from the supervisor's pool (issue 13); each on the
    handed path and on the full path (``cli_path``, issue 21)."""
    if request.param == "cold":
        yield run_cli
        return
    state_dir = private_state_dir()
    try:
        with running_supervisor(state_dir, "--persistent") as supervisor:
            yield HeldCli(witness, supervisor)
        # SIGTERM above: the pool's parked replacement is removed on the way out.
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)


def one_json_object(proc: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout[:500]
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    return doc


@pytest.fixture
def private_tag(witness: Witness, busybox: str) -> Iterator[str]:
    """busybox under a tag no one else uses, so daemon events can be filtered to this test."""
    reference = tag_image(witness, busybox, "sbxkit-test/busybox", unique("cli"))
    try:
        yield reference
    finally:
        delete_image(witness, reference)


def test_cli_json_prints_one_object_and_exits_with_the_payload_code(
    cli_run: CliRun, witness: Witness, busybox: str
) -> None:
    proc = cli_run(
        witness, busybox, "sh", "-c", "echo out; echo err >&2; exit 17", options=("--json",)
    )

    assert proc.returncode == 17, proc.stderr
    doc = one_json_object(proc)
    assert set(doc) == JSON_KEYS  # the documented keys, as the unit test pins them
    assert doc["status"] == "exited"
    assert doc["exit_code"] == 17
    assert doc["stdout"] == "out\n"
    assert doc["stderr"] == "err\n"
    assert doc["stdout_bytes"] == 4
    assert doc["stderr_bytes"] == 4
    container_id = doc["container_id"]
    assert isinstance(container_id, str)
    assert len(container_id) == 64
    # A run returns at the payload's exit (the kernel's evidence, or a claimed pool
    # container); its container is removed by the supervisor right after.
    assert wait_until(lambda: not container_exists(witness, container_id), 10.0)


def test_cli_timeout_exits_124(cli_run: CliRun, witness: Witness, busybox: str) -> None:
    proc = cli_run(witness, busybox, "sleep", "30", options=("--timeout", "1"))

    assert proc.returncode == 124, proc.stderr
    assert proc.stderr.endswith(b"sbxkit: timed out after 1 s\n"), proc.stderr  # the limit named


def test_cli_output_exceeded_exits_123(cli_run: CliRun, witness: Witness, busybox: str) -> None:
    proc = cli_run(
        witness, busybox, "sh", "-c", "head -c 1001 /dev/zero", options=("--max-output", "1000")
    )

    assert proc.returncode == 123, proc.stderr
    assert len(proc.stdout) == 1000
    assert proc.stderr.endswith(b"sbxkit: output exceeded (stdout): limit 1000 bytes\n")


def test_cli_oom_exits_137(cli_run: CliRun, witness: Witness, busybox: str) -> None:
    proc = cli_run(witness, busybox, "tail", "/dev/zero", options=("--memory", "64m", "--json"))

    assert proc.returncode == 137, proc.stderr
    doc = one_json_object(proc)
    assert doc["status"] == "oom_killed"
    assert doc["oom_evidence"]
    assert doc["exit_code"] is None  # the kernel's kill, not the payload's answer (docs/cli.md)


def test_cli_oom_names_the_memory_limit(cli_run: CliRun, witness: Witness, busybox: str) -> None:
    proc = cli_run(witness, busybox, "tail", "/dev/zero", options=("--memory", "64m"))

    assert proc.returncode == 137, proc.stderr
    assert proc.stderr.endswith(b"sbxkit: oom killed: memory limit 64 MiB\n"), proc.stderr


def test_cli_output_encoding_base64_carries_every_byte(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    """Bytes that are not UTF-8 reach ``--json`` exactly under ``--output-encoding base64``;
    the default's U+FFFD stays the default (issue 43, item 10)."""
    cli_path.falls_back("--output-encoding is not handed off")
    payload = ("sh", "-c", "printf 'a\\377\\000b'; printf '\\376' >&2")
    proc = run_cli(witness, busybox, *payload, options=("--json", "--output-encoding", "base64"))

    assert proc.returncode == 0, proc.stderr
    doc = one_json_object(proc)
    assert "stdout" not in doc
    assert "stderr" not in doc
    assert base64.b64decode(str(doc["stdout_base64"])) == b"a\xff\x00b"
    assert base64.b64decode(str(doc["stderr_base64"])) == b"\xfe"
    assert (doc["stdout_bytes"], doc["stderr_bytes"], doc["error"]) == (4, 1, None)
    text = one_json_object(run_cli(witness, busybox, *payload, options=("--json",)))
    assert text["stdout"] == "a\ufffd\x00b"


@pytest.mark.parametrize(
    ("flags", "field"),
    [(("--memory", "0"), "--memory"), (("--user", "0:0"), "user")],
)
def test_cli_refused_input_exits_2_naming_the_field_and_creates_nothing(
    witness: Witness, private_tag: str, flags: tuple[str, ...], field: str, cli_path: CliPath
) -> None:
    cli_path.falls_back("SpecError")  # the full path reproduces the refusal
    marker = unique("refused")
    since = time.time()
    refused = run_cli(witness, private_tag, "echo", marker, options=flags)
    between = time.time()
    # Positive control: the same command without the bad flag does create (and remove) one.
    accepted = run_cli(witness, private_tag, "echo", marker)
    until = time.time()

    assert refused.returncode == 2, refused.stderr
    assert f"{field}:".encode() in refused.stderr, refused.stderr
    assert refused.stdout == b""
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == f"{marker}\n".encode()
    refused_events = witness.events(since, between, type=["container"], image=[private_tag])
    accepted_events = witness.events(between, until, type=["container"], image=[private_tag])
    assert "create" not in actions(refused_events), refused_events
    assert "create" in actions(accepted_events)


def test_cli_missing_image_exits_2(witness: Witness, cli_path: CliPath) -> None:
    cli_path.falls_back("ImageError")
    reference = f"sbxkit-test/missing:{unique('cli-absent')}"
    proc = run_cli(witness, reference, "true")

    assert proc.returncode == 2, proc.stderr
    assert b"not present locally" in proc.stderr
    assert b"never pulls" in proc.stderr
    assert not witness.image_exists(reference)


def test_cli_engine_unavailable_exits_69(busybox: str, cli_path: CliPath) -> None:
    cli_path.falls_back("is not a daemon socket this supervisor was started for")
    proc = sbxkit("run", *SMALL, "--socket", "/nonexistent.sock", busybox, "--", "true")

    assert proc.returncode == 69, proc.stderr
    assert b"/nonexistent.sock" in proc.stderr
    assert b"unavailable" in proc.stderr


def test_cli_stdin_from_a_file(
    cli_run: CliRun, witness: Witness, busybox: str, tmp_path: Path
) -> None:
    data = os.urandom(256 * 1024)
    source = tmp_path / "input.bin"
    source.write_bytes(data)

    proc = cli_run(witness, busybox, "cat", options=("--stdin", str(source)))

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data


def test_cli_stdin_from_dash_reads_the_cli_stdin(
    cli_run: CliRun, witness: Witness, busybox: str
) -> None:
    data = os.urandom(256 * 1024)

    proc = cli_run(witness, busybox, "cat", options=("--stdin", "-"), stdin=data)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data


def test_cli_env_is_visible_to_the_payload(cli_run: CliRun, witness: Witness, busybox: str) -> None:
    value = unique("value")
    host_value = unique("host-value")
    proc = cli_run(
        witness,
        busybox,
        "sh",
        "-c",
        'echo "explicit=$SBXKIT_CLI_VAR"; echo "bare=$SBXKIT_CLI_BARE"; '
        'echo "other=$SBXKIT_CLI_OTHER"',
        options=("--env", f"SBXKIT_CLI_VAR={value}", "--env", "SBXKIT_CLI_BARE"),
        env={"SBXKIT_CLI_BARE": host_value, "SBXKIT_CLI_OTHER": "must-not-pass"},
    )

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [
        f"explicit={value}",
        f"bare={host_value}",
        "other=",
    ]


def test_cli_json_replaces_invalid_utf8_but_counts_raw_bytes(
    cli_run: CliRun, witness: Witness, busybox: str
) -> None:
    proc = cli_run(
        witness,
        busybox,
        "sh",
        "-c",
        r"printf '\377\376ok\n'; printf 'caf\303\251\n' >&2",
        options=("--json",),
    )

    assert proc.returncode == 0, proc.stderr
    doc = one_json_object(proc)
    assert doc["stdout"] == "\ufffd\ufffdok\n"
    assert doc["stdout_bytes"] == 5
    assert doc["stderr"] == "café\n"  # valid UTF-8 passes untouched
    assert doc["stderr_bytes"] == 6


def test_cli_demo_exits_0_and_every_limit_held(witness: Witness) -> None:
    proc = sbxkit("demo", "--socket", witness.socket_path)

    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert b"every limit held" in proc.stdout
    assert b"BROKEN" not in proc.stdout
