"""The command line's open sandboxes, without a daemon: names, paths, frames and the flags
refused before a holder starts."""

from __future__ import annotations

import pytest

import sbxkit.cli._session_wire as wire
from sbxkit._consumers.process_log import ProcessExit
from sbxkit._grammar.common import exit_code_for
from sbxkit._protocol.framing import FrameReader
from sbxkit.cli.parser import build_parser
from sbxkit.cli.sessions import cmd_exec, cmd_open
from sbxkit.errors import SpecError


@pytest.mark.parametrize("name", ["a", "sb-12ab3f", "work.2", "x" * 40])
def test_names_that_are_sessions(name: str) -> None:
    assert wire.check_name(name) == name


@pytest.mark.parametrize("name", ["", "Work", "-x", ".x", "a/b", "a b", "x" * 41, "é"])
def test_names_refused_with_the_rule(name: str) -> None:
    with pytest.raises(SpecError, match="is not a session name: 1 to 40 of a-z"):
        wire.check_name(name, "--name")


def test_the_directory_follows_the_environment() -> None:
    assert wire.sessions_dir({"SBXKIT_SESSIONS_DIR": " /srv/s "}) == "/srv/s"
    assert wire.sessions_dir({}).endswith("/.sbxkit/sessions")


def test_a_socket_path_too_long_is_refused_naming_the_variable() -> None:
    assert wire.socket_path("/tmp/s", "work") == "/tmp/s/work.sock"
    with pytest.raises(SpecError, match=r"SBXKIT_SESSIONS_DIR: .* too long for a Unix socket"):
        wire.socket_path("/tmp/" + "d" * 100, "work")


def test_requests_and_answers_survive_their_frames() -> None:
    request = wire.Exec(secret="s", argv=["cat"], stdin=bytes(range(256)), env={"A": "1"})
    reader = FrameReader(wire.MAX_FRAME)
    data = wire.frame(request)
    [payload] = reader.feed(data[:3]) + reader.feed(data[3:])
    assert wire.decode_request(payload) == request
    ended = ProcessExit(status="exited", exit_code=3, output_bytes=9, run_s=0.5)
    answer = wire.Output(data=b"\xff\x00", cursor=2, done=True, exit=ended)
    [payload] = FrameReader(wire.MAX_FRAME).feed(wire.frame(answer))
    assert wire.decode_answer(payload) == answer


def test_an_unknown_request_field_is_refused() -> None:
    with pytest.raises(Exception, match="unknown field"):
        wire.decode_request(wire.HEADER.pack(0)[:0] + b"\x83\xa2op\xa4list\xa6secret\xa1s\xa1x\x01")


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        ("exited", 5, 5),
        ("timed_out", None, 124),
        ("output_exceeded", None, 123),
        ("killed", None, 137),
    ],
)
def test_wait_exits_as_sbxkit_run_would(status: str, code: int | None, expected: int) -> None:
    ended = ProcessExit(status=status, exit_code=code, output_bytes=0, run_s=1.0)  # type: ignore[arg-type]
    assert exit_code_for(ended) == expected


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(list(argv))


def test_open_refuses_a_command_before_anything_starts() -> None:
    with pytest.raises(SpecError, match="takes an image, not a command \\(sleep 1\\)"):
        cmd_open(_args("open", "img:1", "--", "sleep", "1"))


def test_open_refuses_a_bad_name_before_anything_starts() -> None:
    with pytest.raises(SpecError, match="--name: 'A' is not a session name"):
        cmd_open(_args("open", "--name", "A", "img:1"))


def test_exec_refuses_a_terminal_without_detach_and_a_missing_command() -> None:
    with pytest.raises(SpecError, match="-t: a terminal needs -d here"):
        cmd_exec(_args("exec", "-t", "s", "--", "sh"))
    with pytest.raises(SpecError, match="CMD: missing"):
        cmd_exec(_args("exec", "s"))
