"""The MCP process tools' pure cores: arguments refused by name, the operator's bounds on a
process (lifetime, output, read size and wait), and output cut at UTF-8 character boundaries.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._grammar.profile import decode_profile
from sbxkit._model.spec import Limits
from sbxkit.errors import SpecError
from sbxkit.mcp.arguments import (
    ProcessReadArgs,
    ProcessSignalArgs,
    ProcessStartArgs,
    ProcessWriteArgs,
    decode_args,
)
from sbxkit.mcp.policy import McpPolicy, policy_from_profile
from sbxkit.mcp.process_calls import (
    output_piece,
    read_fields,
    read_request,
    signal_number,
    start_request,
    text_end,
)

PROFILE = """
[sandbox.docker]
image = "sbxkit-test/busybox:latest"

[sandbox.docker.env]
OPERATOR = "set"

[sandbox.docker.limits]
cpus = 1
memory = "256m"
pids = 64
max_output = "64k"
timeout = 30

[mcp]
max_file_bytes = "1k"
max_processes = 2
max_read_wait = 5
"""
SANDBOX = "sbx-" + "a" * 24
PROCESS = "p" + "b" * 16
LIMITS = Limits(cpus=1, memory_bytes=1 << 28, pids=64, output_bytes=65536, timeout_s=30)


@pytest.fixture(scope="module")
def policy() -> McpPolicy:
    return policy_from_profile(decode_profile(PROFILE))


def refusal(arguments: dict[str, Any], kind: Any) -> SpecError:
    with pytest.raises(SpecError) as caught:
        decode_args(arguments, kind)
    return caught.value


# --- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "kind", "field", "rule"),
    [
        ({"sandbox_id": SANDBOX}, ProcessStartArgs, "command", "one is required"),
        (
            {"sandbox_id": SANDBOX, "command": ["sh"], "shell": "ls"},
            ProcessStartArgs,
            "command",
            "not both",
        ),
        ({"sandbox_id": SANDBOX, "shell": "  "}, ProcessStartArgs, "shell", "is empty"),
        ({"sandbox_id": SANDBOX, "shell": "a\0b"}, ProcessStartArgs, "shell", "NUL"),
        ({"sandbox_id": SANDBOX, "command": []}, ProcessStartArgs, "command", "non-empty"),
        ({"sandbox_id": SANDBOX, "shell": "ls", "pty": "yes"}, ProcessStartArgs, "pty", "bool"),
        ({"sandbox_id": SANDBOX, "shell": "ls", "cwd": "rel"}, ProcessStartArgs, "cwd", "absol"),
        (
            {"sandbox_id": SANDBOX, "shell": "ls", "env": {"A B": "1"}},
            ProcessStartArgs,
            "env['A B']",
            "",
        ),
        ({"sandbox_id": SANDBOX, "shell": "ls", "user": "0"}, ProcessStartArgs, "user", "unknown"),
        ({"sandbox_id": SANDBOX, "process_id": "42"}, ProcessReadArgs, "process_id", "process id"),
        ({"sandbox_id": "x", "process_id": PROCESS}, ProcessReadArgs, "sandbox_id", "sandbox id"),
        (
            {"sandbox_id": SANDBOX, "process_id": PROCESS, "cursor": -1},
            ProcessReadArgs,
            "cursor",
            ">= 0",
        ),
        (
            {"sandbox_id": SANDBOX, "process_id": PROCESS, "wait": -1},
            ProcessReadArgs,
            "wait",
            ">= 0",
        ),
        (
            {"sandbox_id": SANDBOX, "process_id": PROCESS, "cursor": True},
            ProcessReadArgs,
            "cursor",
            "int",
        ),
        (
            {"sandbox_id": SANDBOX, "process_id": PROCESS, "encoding": "latin-1"},
            ProcessWriteArgs,
            "encoding",
            "",
        ),
        ({"sandbox_id": SANDBOX, "process_id": PROCESS}, ProcessSignalArgs, "signal", "missing"),
    ],
)
def test_bad_process_arguments_name_the_field_and_rule(
    arguments: dict[str, Any], kind: Any, field: str, rule: str
) -> None:
    error = refusal(arguments, kind)
    assert error.field == field
    assert rule in error.rule


def test_a_shell_line_runs_under_sh_c(policy: McpPolicy) -> None:
    args = decode_args({"sandbox_id": SANDBOX, "shell": "echo $((6*7))"}, ProcessStartArgs)
    request = start_request(policy, LIMITS, 600.0, args)
    assert request.command == ["sh", "-c", "echo $((6*7))"]
    assert (request.timeout_s, request.max_output, request.pty) == (600.0, 65536, False)
    assert request.env is None


def test_a_process_lowers_the_sandboxs_lifetime_and_output(policy: McpPolicy) -> None:
    args = decode_args(
        {"sandbox_id": SANDBOX, "command": ["sh"], "timeout": 100, "max_output": "1k"},
        ProcessStartArgs,
    )
    request = start_request(policy, LIMITS, 600.0, args)
    assert (request.timeout_s, request.max_output) == (100.0, 1024)
    for asked, field, rule in (
        ({"timeout": 601}, "timeout", "this sandbox's lifetime limit of 600 s"),
        ({"timeout": 0}, "timeout", ""),
        ({"max_output": "65k"}, "max_output", "this sandbox's limit of 64 KiB"),
    ):
        args = decode_args({"sandbox_id": SANDBOX, "command": ["sh"], **asked}, ProcessStartArgs)
        with pytest.raises(SpecError) as caught:
            start_request(policy, LIMITS, 600.0, args)
        assert caught.value.field == field
        assert rule in caught.value.rule


def test_a_process_adds_env_but_never_changes_the_operators(policy: McpPolicy) -> None:
    ok = decode_args({"sandbox_id": SANDBOX, "shell": "x", "env": {"A": "1"}}, ProcessStartArgs)
    assert start_request(policy, LIMITS, 60.0, ok).env == {"OPERATOR": "set", "A": "1"}
    bad = decode_args(
        {"sandbox_id": SANDBOX, "shell": "x", "env": {"OPERATOR": "mine"}}, ProcessStartArgs
    )
    with pytest.raises(SpecError) as caught:
        start_request(policy, LIMITS, 60.0, bad)
    assert caught.value.field == "env['OPERATOR']"


def test_reads_are_bounded_by_the_policy(policy: McpPolicy) -> None:
    def read(**asked: Any) -> Any:
        args = decode_args({"sandbox_id": SANDBOX, "process_id": PROCESS, **asked}, ProcessReadArgs)
        return read_request(policy, args)

    assert read().max_bytes == 1024  # the default 64 KiB, lowered to mcp.max_file_bytes
    assert read(max_bytes="1k", wait=5, cursor=7).max_bytes == 1024
    for asked, field, rule in (
        ({"max_bytes": 1025}, "max_bytes", "4 to 1024 bytes (mcp.max_file_bytes)"),
        ({"max_bytes": 3}, "max_bytes", "asked for 3"),
        ({"max_bytes": "lots"}, "max_bytes", "not a size"),
        ({"wait": 5.5}, "wait", "at most 5 s (mcp.max_read_wait)"),
    ):
        with pytest.raises(SpecError) as caught:
            read(**asked)
        assert (caught.value.field, rule in caught.value.rule) == (field, True), caught.value


def test_signals_by_name_or_number() -> None:
    def number(sig: Any) -> int:
        args = decode_args(
            {"sandbox_id": SANDBOX, "process_id": PROCESS, "signal": sig}, ProcessSignalArgs
        )
        return signal_number(args)

    assert number("TERM") == number("SIGTERM") == number(15) == 15
    assert number("int") == 2
    for bad in ("NOPE", 999):
        with pytest.raises(SpecError) as caught:
            number(bad)
        assert caught.value.field == "signal"


@pytest.mark.parametrize(
    ("table", "field", "rule"),
    [
        ("max_processes = 0", "mcp.max_processes", ">= 1"),
        ("max_processes = 65", "mcp.max_processes", "<= 64"),
        ("max_processes = true", "mcp.max_processes", "int"),
        ("max_read_wait = -1", "mcp.max_read_wait", "0..600"),
        ("max_read_wait = 601", "mcp.max_read_wait", "0..600"),
        ('max_read_wait = "1m"', "mcp.max_read_wait", "float"),
    ],
)
def test_the_process_options_are_checked_by_path(table: str, field: str, rule: str) -> None:
    with pytest.raises(SpecError) as caught:
        decode_profile(f"[sandbox.docker]\n[mcp]\n{table}\n")
    assert caught.value.field == field
    assert rule in caught.value.rule


# --- output as text --------------------------------------------------------------------------


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_text_is_never_split_inside_a_character(text: str, at: int) -> None:
    """Reading in pieces cut at any byte gives back the text exactly, no U+FFFD added."""
    data = text.encode("utf-8", "surrogatepass")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return  # not UTF-8 a process could write as text
    cursor, pieces = 0, []
    while cursor < len(data):
        chunk = data[cursor : cursor + max(4, at)]
        final = cursor + len(chunk) == len(data)
        content, used = output_piece(chunk, "utf-8", final=final)
        assert used > 0
        pieces.append(content)
        cursor += used
    assert "".join(pieces) == text


def test_text_end_leaves_out_only_an_incomplete_tail() -> None:
    euro = "€".encode()  # 3 bytes
    assert text_end(b"ab" + euro[:2]) == 2
    assert text_end(b"ab" + euro) == 5
    assert text_end(b"\xff\xfe") == 2  # not UTF-8: whole, as U+FFFD
    assert text_end(b"\x80\x80\x80\x80") == 4
    assert output_piece(b"\xff", "utf-8", final=False) == ("\ufffd", 1)
    assert output_piece(euro[:2], "utf-8", final=True) == ("\ufffd", 2)
    assert output_piece(euro[:2], "base64", final=False) == (
        base64.b64encode(euro[:2]).decode(),
        2,
    )


def test_a_read_that_stops_before_a_split_character_is_not_done() -> None:
    args = ProcessReadArgs(sandbox_id=SANDBOX, process_id=PROCESS, cursor=10)
    request = read_request_for(args)
    fields = read_fields(SANDBOX, PROCESS, request, b"hi\xe2\x82", "utf-8", done=False, exit_=None)
    assert (fields["output"], fields["next_cursor"], fields["bytes"]) == ("hi", 12, 2)
    assert (fields["done"], fields["running"], fields["exit"]) == (False, True, None)


def read_request_for(args: ProcessReadArgs) -> Any:
    return read_request(policy_from_profile(decode_profile(PROFILE)), args)
