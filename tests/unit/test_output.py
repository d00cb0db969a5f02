"""Output caps: exactly N bytes pass, byte N+1 exceeds, the head is kept, splits do not matter."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._lifecycle.output import CappedBuffer, OutputCapture
from sbxkit.engine.frames import STDERR, STDIN, STDOUT, SYSTEMERR


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def first_to_exceed(cap: int, writes: list[tuple[int, bytes]]) -> str | None:
    seen = {"stdout": 0, "stderr": 0}
    for stream_id, payload in writes:
        name = "stdout" if stream_id in (STDIN, STDOUT) else "stderr"
        seen[name] += len(payload)
        if seen[name] > cap:
            return name
    return None


# --- CappedBuffer -----------------------------------------------------------------------------


@given(cap=st.integers(0, 40), payload=st.binary(max_size=80), data=st.data())
def test_any_split_keeps_the_same_head(cap: int, payload: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(payload)), max_size=10))
    buffer = CappedBuffer(cap)
    signals = []
    for piece in split(payload, cuts):
        signals.append(buffer.add(piece))
        assert buffer.kept_bytes <= cap
    assert buffer.value() == payload[:cap]
    assert buffer.exceeded == (len(payload) > cap)
    assert buffer.total_seen == len(payload)
    assert signals.count(True) == int(buffer.exceeded)


def test_exactly_cap_bytes_pass_and_one_more_exceeds() -> None:
    buffer = CappedBuffer(5)
    assert buffer.add(b"abc") is False
    assert buffer.add(b"de") is False
    assert not buffer.exceeded
    assert buffer.value() == b"abcde"
    assert buffer.add(b"f") is True
    assert buffer.exceeded
    assert buffer.add(b"more") is False  # only the first overflow is signalled
    assert buffer.value() == b"abcde"
    assert buffer.total_seen == 10


def test_cap_zero_keeps_nothing_and_exceeds_on_first_byte() -> None:
    buffer = CappedBuffer(0)
    assert buffer.add(b"") is False
    assert not buffer.exceeded
    assert buffer.add(b"x") is True
    assert buffer.value() == b""
    assert buffer.kept_bytes == 0


def test_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="cap must be >= 0"):
        CappedBuffer(-1)


# --- OutputCapture ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stream_id", "name"),
    [(STDIN, "stdout"), (STDOUT, "stdout"), (STDERR, "stderr"), (SYSTEMERR, "stderr")],
)
def test_exactly_n_passes_and_n_plus_1_exceeds_per_stream(stream_id: int, name: str) -> None:
    capture = OutputCapture(4)
    assert capture.add(stream_id, b"1234") is False
    assert capture.overflowed is None
    assert getattr(capture, name) == b"1234"
    assert getattr(capture, f"{name}_bytes") == 4

    assert capture.add(stream_id, b"5") is True
    assert capture.overflowed == name
    assert getattr(capture, name) == b"1234"
    other = "stderr" if name == "stdout" else "stdout"
    assert getattr(capture, other) == b""
    assert getattr(capture, f"{other}_bytes") == 0


def test_cap_applies_to_each_stream_separately() -> None:
    capture = OutputCapture(3)
    assert capture.add(STDOUT, b"abc") is False
    assert capture.add(STDERR, b"xyz") is False
    assert capture.overflowed is None
    assert (capture.stdout, capture.stderr) == (b"abc", b"xyz")


def test_first_stream_to_overflow_is_reported() -> None:
    capture = OutputCapture(2)
    assert capture.add(STDOUT, b"ab") is False
    assert capture.add(STDERR, b"abc") is True
    assert capture.add(STDOUT, b"c") is False  # stdout exceeds too, but it was not first
    assert capture.overflowed == "stderr"
    assert (capture.stdout, capture.stderr) == (b"ab", b"ab")


def test_capture_cap_zero() -> None:
    capture = OutputCapture(0)
    assert capture.add(STDERR, b"") is False
    assert capture.overflowed is None
    assert capture.add(STDOUT, b"!") is True
    assert capture.overflowed == "stdout"
    assert capture.stdout == b""


@given(
    cap=st.integers(0, 30),
    writes=st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=20)), max_size=10),
    data=st.data(),
)
def test_capture_is_split_invariant(
    cap: int, writes: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    whole = OutputCapture(cap)
    for stream_id, payload in writes:
        whole.add(stream_id, payload)

    pieces = OutputCapture(cap)
    signals = []
    for stream_id, payload in writes:
        cuts = data.draw(st.lists(st.integers(0, len(payload)), max_size=4))
        signals += [pieces.add(stream_id, piece) for piece in split(payload, cuts)]

    expected_out = b"".join(p for s, p in writes if s in (STDIN, STDOUT))
    expected_err = b"".join(p for s, p in writes if s in (STDERR, SYSTEMERR))
    for capture in (whole, pieces):
        assert capture.stdout == expected_out[:cap]
        assert capture.stderr == expected_err[:cap]
        assert capture.stdout_bytes == len(capture.stdout)
        assert capture.stderr_bytes == len(capture.stderr)
    assert whole.overflowed == first_to_exceed(cap, writes)
    assert pieces.overflowed == whole.overflowed
    assert signals.count(True) == (pieces.overflowed is not None)


def test_unknown_stream_id_is_refused() -> None:
    with pytest.raises(ValueError, match="stream id must be 0-3"):
        OutputCapture(1).add(4, b"x")
