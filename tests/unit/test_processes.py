"""The pure parts of background processes: the output log's cursor and the argument checks."""

from __future__ import annotations

import signal

import pytest

from sbxkit._consumers.process_log import (
    OutputLog,
    check_max_processes,
    check_read,
    check_signal,
    check_terminal_size,
)
from sbxkit.errors import SpecError


def test_the_log_reads_by_cursor_and_keeps_everything_under_its_cap() -> None:
    log = OutputLog(10)
    assert not log.add(b"abc")
    assert not log.add(b"def")
    assert log.read(0, 100) == (b"abcdef", 6)
    assert log.read(2, 3) == (b"cde", 5)
    assert log.read(6, 100) == (b"", 6)
    assert log.read(0, 100) == (b"abcdef", 6)  # a cursor can be read again


def test_exactly_the_cap_passes_and_the_first_byte_past_it_overflows_once() -> None:
    log = OutputLog(4)
    assert not log.add(b"abcd")
    assert not log.overflowed
    assert log.add(b"ef")  # byte 5: the overflow, said once
    assert not log.add(b"g")
    assert log.overflowed
    assert log.size == 4
    assert log.read(0, 100) == (b"abcd", 4)
    assert OutputLog(0).add(b"x")
    with pytest.raises(ValueError, match="cap"):
        OutputLog(-1)


@pytest.mark.parametrize(
    ("cursor", "max_bytes", "wait", "field"),
    [
        (-1, 1, 0, "cursor"),
        (7, 1, 0, "cursor"),  # past what there is
        (True, 1, 0, "cursor"),
        ("0", 1, 0, "cursor"),
        (0, 0, 0, "max_bytes"),
        (0, 1.5, 0, "max_bytes"),
        (0, 1, -1, "wait"),
        (0, 1, float("nan"), "wait"),
        (0, 1, "1", "wait"),
    ],
)
def test_bad_read_arguments_name_the_argument(
    cursor: object, max_bytes: object, wait: object, field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        check_read(cursor, max_bytes, wait, size=6)
    assert caught.value.args[0].startswith(field) or field in str(caught.value)
    assert repr(cursor if field == "cursor" else max_bytes if field == "max_bytes" else wait)[
        :3
    ] in str(caught.value)


def test_good_read_arguments_pass() -> None:
    check_read(0, 1, 0, size=0)
    check_read(6, 10, 2.5, size=6)


def test_signals_by_number_or_name() -> None:
    assert check_signal(15) == check_signal("TERM") == check_signal("sigterm") == 15
    assert check_signal(signal.SIGINT) == 2
    for bad in ("NOPE", 0, 999, True, 1.5, None):
        with pytest.raises(SpecError, match="sig"):
            check_signal(bad)


def test_max_processes_and_terminal_size() -> None:
    assert check_max_processes(1) == 1
    for bad in (0, -3, True, 2.0, "16"):
        with pytest.raises(SpecError, match="max_processes"):
            check_max_processes(bad)
    check_terminal_size(24, 80)
    with pytest.raises(SpecError, match="rows"):
        check_terminal_size(0, 80)
    with pytest.raises(SpecError, match="columns"):
        check_terminal_size(24, 70000)
