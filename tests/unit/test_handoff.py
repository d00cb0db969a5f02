"""``sbxkit run``'s hand-off, without a daemon (issue 21, item 5): the command line's quick
scan of argv, its messages against the supervisor's decoders, what it prints against what the
full path prints, what it imports, and its run on FIFOs against a real process."""

from __future__ import annotations

import binascii
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbxkit._grammar.common import json_error, to_json
from sbxkit._model.result import PhaseTimings, RunResult
from sbxkit._protocol.fingerprint import PROTOCOL_VERSION, implementation_fingerprint
from sbxkit._protocol.proof import is_well_formed, secret_hash
from sbxkit._protocol.wire import Hello, Run, RunCancel, RunEnded, RunStarted, decode_client, encode
from sbxkit._util.capped import CappedBuffer
from sbxkit.handoff.client import (
    cancel_message,
    ended_message,
    error_json,
    hello_message,
    run_message,
    with_output,
)
from sbxkit.handoff.fifos import Ends, Watched, watch
from sbxkit.handoff.rejoin import rejoin, resume_message
from sbxkit.handoff.scan import Scan, scan_run
from sbxkit.supervisor.handoff.owner import Declined
from sbxkit.supervisor.handoff.serve import parse_run, result_document

# -- the scan ---------------------------------------------------------------------------------


def scanned(*argv: str) -> Scan:
    scan = scan_run(argv)
    assert isinstance(scan, Scan), scan
    return scan


def test_the_scan_finds_json_stdin_and_env_names_before_the_separator() -> None:
    scan = scanned(
        "run",
        "--json",
        "--stdin=-",
        "--env",
        "A",
        "--env=B",
        "--env",
        "C=1",
        "img",
        "--",
        "echo",
        "--json",
        "--stdin",
        "x",
        "--env",
        "D",
    )
    assert (scan.json, scan.stdin, scan.env_names) == (True, "-", ("A", "B"))


def test_the_scan_reads_dockers_short_spellings() -> None:
    scan = scanned("run", "-i", "-e", "A", "-e", "B=2", "img", "--", "cat")
    assert (scan.json, scan.stdin, scan.env_names) == (False, "-", ("A",))


def test_the_scan_leaves_a_run_without_those_flags_alone() -> None:
    scan = scanned("run", "--memory", "64m", "img", "--", "true")
    assert (scan.json, scan.stdin, scan.env_names) == (False, None, ())


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        ((), "not `sbxkit run`"),
        (("batch", "jobs.jsonl"), "not `sbxkit run`"),
        (("--version",), "not `sbxkit run`"),
        (("run", "--profile", "p.toml", "--", "x"), "--profile"),
        (("run", "--help"), "--help"),
        (("run", "img", "--", "echo", "\udcff"), "not UTF-8"),
        (("run", "-v", "./src:/src", "img", "--", "ls"), "-v"),
        (("run", "--env-file", "e", "img", "--", "env"), "--env-file"),
    ],
)
def test_the_scan_declines_what_the_hand_off_never_serves(argv: tuple[str, ...], why: str) -> None:
    reason = scan_run(argv)
    assert isinstance(reason, str)
    assert why in reason


def served(argv: list[str], *, json_flag: bool = False, stdin: str | None = None) -> Run:
    return Run(argv=argv, state_dir="/x", env={}, json=json_flag, stdin=stdin)


def test_the_supervisor_parses_with_the_cli_run_parser() -> None:
    args = parse_run(
        served(["run", "--memory", "64m", "img", "--json", "--", "echo", "hi"], json_flag=True)
    )
    assert (args.image, args.command, args.memory, args.json) == (
        "img",
        ["--", "echo", "hi"],
        "64m",
        True,
    )


@pytest.mark.parametrize(
    ("argv", "json_flag", "stdin", "why"),
    [
        (["run", "--mem", "64m", "img", "--", "x"], False, None, "unrecognized"),  # no abbrevs
        (["run", "--memory"], False, None, "usage:"),
        (["run", "img", "--json"], False, None, "usage:"),  # a flag after IMAGE, no --
        (["run", "img", "echo", "--json"], True, None, "disagrees"),  # the payload's word
        (["run", "--stdin", "f", "img", "--", "x"], False, None, "disagrees"),
        (
            ["run", "--tls-ca", "ca.pem", "--callback", "http://h:1", "img", "--", "x"],
            False,
            None,
            "relative",
        ),
    ],
)
def test_what_the_parse_refuses_or_disagrees_with_is_declined(
    argv: list[str], json_flag: bool, stdin: str | None, why: str
) -> None:
    with pytest.raises(Declined) as declined:
        parse_run(served(argv, json_flag=json_flag, stdin=stdin))
    assert why in str(declined.value)


# -- the messages -----------------------------------------------------------------------------


def decoded(message: dict[str, object]) -> object:
    return decode_client(json.dumps(message, ensure_ascii=False).encode())


def test_the_command_lines_messages_are_the_supervisors() -> None:
    assert decoded(hello_message()) == Hello(
        protocol=PROTOCOL_VERSION, fingerprint=implementation_fingerprint()
    )
    scan = scanned("run", "--json", "img", "--", "café")
    env = {"SBXKIT_ENV": "ci", "K": "é"}
    assert decoded(run_message(["run", "--json", "img", "--", "café"], "/s", env, scan)) == Run(
        argv=["run", "--json", "img", "--", "café"], state_dir="/s", env=env, json=True
    )
    watched = Watched("output_exceeded", CappedBuffer(3), CappedBuffer(3))
    watched.stdout.add(b"abcd")
    watched.overflowed = "stdout"
    assert decoded(ended_message(watched)) == RunEnded(
        status="output_exceeded", stdout_bytes=3, stderr_bytes=0, overflowed="stdout"
    )
    assert decoded(cancel_message(2)) == RunCancel(signal=2)


def run_started(line: bytes, **extra: Any) -> RunStarted:
    fields = {"lease": "l", "output_bytes": 1, "timeout_s": 1.5, "drain_s": 2.0, "fds": 4}
    return RunStarted(line=line, lost_status=74, lost_stderr="x\n", **{**fields, **extra})


def test_the_command_line_reads_the_line_of_a_run_started() -> None:
    line = b"'echo' 'hi \xc3\xa9'\n"
    started = run_started(line)
    doc = json.loads(encode(started)[4:])
    assert binascii.a2b_base64(doc["line"]) == line
    assert (doc["type"], doc["timeout_s"], doc["lost_json"]) == ("run_started", 1.5, None)


def test_a_run_whose_supervisor_died_is_resumed_with_its_secret_and_what_it_saw() -> None:
    secret = "ab" * 32
    started = run_started(
        b"go\n",
        lease="l" * 32,
        secret=secret,
        engine_socket="/run/docker.sock",
        pooled=True,
        queued_s=0.25,
    )
    seen = json.loads(encode(started)[4:])  # as the command line reads it
    watched = Watched("exited", CappedBuffer(8), CappedBuffer(8))
    watched.stdout.add(b"out\n")
    resume = resume_message(seen, ended_message(watched), 3, 2.5, True)
    assert decode_client(encode(resume)[4:]) == resume
    assert (resume.lease, resume.secret, resume.exit_code) == ("l" * 32, secret, 3)
    assert resume.ended == RunEnded(status="exited", stdout_bytes=4, stderr_bytes=0)
    assert (resume.json, resume.pooled, resume.queued_s, resume.run_s) == (True, True, 0.25, 2.5)
    assert is_well_formed(resume.next_secret_hash)
    assert resume.next_secret_hash != secret_hash(secret)


def test_a_run_started_without_a_secret_is_lost_without_asking_anyone() -> None:
    seen = {"lease": "l", "secret": None, "line": ""}
    ended = {"type": "run_ended", "status": "exited"}
    assert rejoin(seen, ended, -1, 0.0, "/nonexistent", False) == (
        None,
        "lost: the lease cannot be re-adopted (no secret)",
    )


# -- what is printed --------------------------------------------------------------------------

floats = st.floats(min_value=0, max_value=1e6, allow_nan=False)
results = st.builds(
    RunResult,
    status=st.sampled_from(["exited", "timed_out", "output_exceeded", "oom_killed", "killed"]),
    exit_code=st.none() | st.integers(0, 255),
    stdout=st.binary(max_size=64),
    stderr=st.binary(max_size=64),
    overflowed=st.sampled_from([None, "stdout", "stderr"]),
    container_id=st.text(max_size=20),
    lease=st.text(max_size=20),
    timings=st.builds(
        PhaseTimings,
        queued_s=floats,
        create_s=floats,
        start_s=floats,
        run_s=floats,
        remove_s=floats,
    ),
    oom_evidence=st.none() | st.text(max_size=30),
    kill_evidence=st.none() | st.text(max_size=30),
    pooled=st.booleans(),
    evidence=st.sampled_from(["kernel", "daemon"]),
)


@settings(max_examples=300)
@given(results)
def test_the_handed_off_json_document_is_the_full_paths_byte_for_byte(result: RunResult) -> None:
    """The supervisor renders the document without the output (it never has it); the
    command line puts its output in: the bytes are ``to_json``'s."""
    empty = msgspec.structs.replace(result, stdout=b"", stderr=b"")
    document = result_document(empty, len(result.stdout), len(result.stderr))
    assert with_output(document, result.stdout, result.stderr) == to_json(result)


@given(
    st.text(max_size=80), st.sampled_from(["Interrupted", "SupervisorError"]), st.integers(0, 255)
)
def test_the_command_lines_error_object_is_the_full_paths(
    message: str, kind: str, code: int
) -> None:
    assert error_json(kind, message, code) == json_error(kind, message, None, code)


# -- what it imports --------------------------------------------------------------------------


def test_the_command_line_loads_neither_trio_nor_msgspec_nor_the_cli() -> None:
    probe = "import sys, sbxkit.handoff.client\nprint('\\n'.join(sorted(sys.modules)))\n"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "sbxkit.handoff.client" in loaded  # the probe can see what it loaded
    heavy = [
        name
        for name in loaded
        if name.split(".")[0] in ("trio", "msgspec", "h11")
        or name.startswith("sbxkit.cli")
        or name in ("dataclasses", "typing_extensions", "asyncio", "sbxkit.errors")
    ]
    assert heavy == []


# -- the run on the FIFOs, against a real process ---------------------------------------------


class Sandbox:
    """A process standing in for a sandbox: its stdio on three FIFOs opened as the kernel
    path opens them, its pid held as a pidfd, waiting for its go line like the FIFO shell."""

    def __init__(self, tmp: Path, command: str) -> None:
        for name in ("in", "out", "err"):
            os.mkfifo(tmp / name, 0o600)
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        self.ends = Ends(
            os.open(tmp / "in", os.O_RDWR | flags),
            os.open(tmp / "out", os.O_RDONLY | flags),
            os.open(tmp / "err", os.O_RDONLY | flags),
            -1,
        )
        script = f"exec <{tmp}/in >{tmp}/out 2>{tmp}/err; printf R >&2; IFS= read -r go; {command}"
        self.proc = subprocess.Popen(["sh", "-c", script])
        self.ends.pidfd = os.pidfd_open(self.proc.pid)
        select.select([self.ends.stderr], [], [], 10)
        assert os.read(self.ends.stderr, 1) == b"R"

    def watch(
        self, *, source: int | None = None, cap: int = 1 << 20, timeout: float = 10
    ) -> Watched:
        r, w = os.pipe()
        try:
            return watch(self.ends, b"\n", source, cap, timeout, 2.0, r, lambda: False)
        finally:
            self.ends.close_all()
            os.close(r)
            os.close(w)
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


def test_stdin_streams_in_and_output_comes_back_byte_exact(tmp_path: Path) -> None:
    data = os.urandom(300_000)  # more than the FIFOs hold: stdin and output must interleave
    (tmp_path / "data").write_bytes(data)
    source = os.open(tmp_path / "data", os.O_RDONLY)
    try:
        watched = Sandbox(tmp_path, "cat; echo done >&2").watch(source=source)
    finally:
        os.close(source)
    assert watched.status == "exited"
    assert watched.stdout.value() == data
    assert watched.stderr.value() == b"done\n"


def test_exactly_the_cap_passes_and_one_more_byte_overflows(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fits = Sandbox(tmp_path / "a", "head -c 1000 /dev/zero").watch(cap=1000)
    over = Sandbox(tmp_path / "b", "head -c 1001 /dev/zero >&2; sleep 5").watch(cap=1000)
    assert (fits.status, len(fits.stdout.value())) == ("exited", 1000)
    assert (over.status, over.overflowed, len(over.stderr.value())) == (
        "output_exceeded",
        "stderr",
        1000,
    )


def test_the_time_limit_ends_a_payload_that_runs_on(tmp_path: Path) -> None:
    started = time.monotonic()
    watched = Sandbox(tmp_path, "echo before; exec sleep 30").watch(timeout=0.5)
    assert watched.status == "timed_out"
    assert watched.stdout.value() == b"before\n"
    assert time.monotonic() - started < 10


def test_an_exit_and_more_stdin_in_one_poll_end_the_input_once(tmp_path: Path) -> None:
    """The init's exit and the stdin source can be ready in the same poll: the exit stops the
    feed first (its source unregistered), and the source's turn must not read or unregister
    it again. CI once saw the command line die of that (KeyError in ``readable``)."""
    sandbox = Sandbox(tmp_path, "exit 0")  # exits as soon as its go line is read
    source_r, source_w = os.pipe()
    os.write(source_w, b"more input")  # readable from the start
    turns: list[int] = []

    def signalled() -> bool:
        turns.append(1)
        if len(turns) == 2:  # the go line went out: let the exit and the source both be ready
            time.sleep(0.5)
        return False

    r, w = os.pipe()
    try:
        watched = watch(sandbox.ends, b"\n", source_r, 1 << 20, 10, 2.0, r, signalled)
    finally:
        sandbox.ends.close_all()
        for fd in (r, w, source_r, source_w):
            os.close(fd)
        sandbox.proc.wait()
    assert watched.status == "exited"


def test_sbxkits_own_lines_end_what_a_payload_left_open_on_a_terminal_only() -> None:
    """On a terminal a line of sbxkit's own starts by ending any escape sequence or string,
    attribute and character set the payload's output left open; elsewhere it is plain."""
    import io
    import os

    from sbxkit._util.notice import TERMINAL_RESET, say

    plain = io.StringIO()
    say("sbxkit: timed out", plain)
    assert plain.getvalue() == "sbxkit: timed out\n"
    controller, terminal = os.openpty()
    try:
        with os.fdopen(terminal, "w", closefd=False) as stream:
            say("sbxkit: timed out", stream)
        seen = os.read(controller, 4096)
    finally:
        os.close(controller)
        os.close(terminal)
    assert seen.startswith(b"\x18\x1b\\")  # CAN, then ST: an OSC or DCS string ends
    assert seen.replace(b"\r\n", b"\n") == (TERMINAL_RESET + "sbxkit: timed out\n").encode()
