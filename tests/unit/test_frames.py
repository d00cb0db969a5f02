"""The attach-stream demuxer: split invariance, no payload buffering, strict refusal."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit.engine.frames import STDERR, STDIN, STDOUT, SYSTEMERR, Demuxer, encode_frame
from sbxkit.errors import FrameError

Frame = tuple[int, bytes]

frames_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.binary(max_size=40)),
    max_size=12,
)


def runs(chunks: list[Frame]) -> list[Frame]:
    """Merge neighbouring chunks of one stream and drop empty ones: what a reader observes."""
    merged: list[Frame] = []
    for stream_id, payload in chunks:
        if not payload:
            continue
        if merged and merged[-1][0] == stream_id:
            merged[-1] = (stream_id, merged[-1][1] + payload)
        else:
            merged.append((stream_id, payload))
    return merged


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def header(stream_id: int, size: int = 0) -> bytes:
    """A raw header: unlike encode_frame it takes any stream id and needs no payload."""
    return bytes([stream_id, 0, 0, 0]) + size.to_bytes(4, "big")


# --- well-formed input ------------------------------------------------------------------------


@given(frames=frames_strategy, data=st.data())
def test_any_split_yields_same_bytes_per_stream(frames: list[Frame], data: st.DataObject) -> None:
    encoded = b""
    is_payload: list[bool] = []
    for stream_id, payload in frames:
        encoded += encode_frame(stream_id, payload)
        is_payload += [False] * 8 + [True] * len(payload)
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=20))

    demuxer = Demuxer()
    chunks: list[Frame] = []
    start = 0
    for piece in split(encoded, cuts):
        out = demuxer.feed(piece)
        assert all(chunk for _, chunk in out)
        # Every payload byte of this piece comes out now: nothing waits for the frame's end.
        assert sum(len(chunk) for _, chunk in out) == sum(is_payload[start : start + len(piece)])
        chunks += out
        start += len(piece)
    demuxer.close()

    assert not demuxer.mid_frame
    assert runs(chunks) == runs(frames)
    for stream_id in (STDIN, STDOUT, STDERR, SYSTEMERR):
        got = b"".join(c for s, c in chunks if s == stream_id)
        assert got == b"".join(p for s, p in frames if s == stream_id)


def test_zero_length_frames_emit_nothing() -> None:
    demuxer = Demuxer()
    assert demuxer.feed(encode_frame(STDOUT, b"") + encode_frame(STDERR, b"")) == []
    assert not demuxer.mid_frame
    demuxer.close()


def test_one_feed_with_several_frames_keeps_order() -> None:
    stream = encode_frame(STDOUT, b"out") + encode_frame(STDERR, b"err") + encode_frame(1, b"!")
    assert Demuxer().feed(stream) == [(STDOUT, b"out"), (STDERR, b"err"), (STDOUT, b"!")]


def test_huge_frame_is_streamed_not_buffered() -> None:
    demuxer = Demuxer()
    assert demuxer.feed(header(STDOUT, size=2**32 - 1)) == []
    assert demuxer.mid_frame
    assert demuxer.feed(b"0123456789") == [(STDOUT, b"0123456789")]
    assert demuxer.mid_frame


def test_header_split_byte_by_byte() -> None:
    demuxer = Demuxer()
    for byte in encode_frame(STDERR, b"")[:-1] + b"\x02":
        assert demuxer.feed(bytes([byte])) == []
    assert demuxer.mid_frame
    assert demuxer.feed(b"ab") == [(STDERR, b"ab")]
    assert not demuxer.mid_frame


def test_empty_feed_is_a_no_op() -> None:
    demuxer = Demuxer()
    assert demuxer.feed(b"") == []
    assert not demuxer.mid_frame
    demuxer.close()


def test_feed_after_close_is_a_caller_bug() -> None:
    demuxer = Demuxer()
    demuxer.close()
    with pytest.raises(RuntimeError, match="after close"):
        demuxer.feed(b"")


# --- truncated input --------------------------------------------------------------------------


@given(frames=frames_strategy.filter(bool), data=st.data())
def test_truncated_input_raises_on_close(frames: list[Frame], data: st.DataObject) -> None:
    encoded = b"".join(encode_frame(s, p) for s, p in frames)
    last_frame_len = 8 + len(frames[-1][1])
    cut = data.draw(st.integers(1, last_frame_len - 1))
    demuxer = Demuxer()
    demuxer.feed(encoded[:-cut])
    assert demuxer.mid_frame
    with pytest.raises(FrameError, match="input ended inside"):
        demuxer.close()


def test_close_mid_header_reports_header_bytes() -> None:
    demuxer = Demuxer()
    demuxer.feed(encode_frame(STDOUT, b"ok") + b"\x02\x00\x00")
    with pytest.raises(FrameError, match=r"byte 13: .*header after 3 of 8 bytes \(02 00 00\)"):
        demuxer.close()


def test_close_mid_payload_reports_missing_bytes() -> None:
    demuxer = Demuxer()
    assert demuxer.feed(header(STDOUT, size=2**32 - 1) + b"0123456789") == [(1, b"0123456789")]
    with pytest.raises(FrameError, match=rf"byte 18: .*stream 1 payload with {2**32 - 11} bytes"):
        demuxer.close()


# --- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize("stream_id", [4, 5, 0x7F, 0xFF])
def test_stream_id_above_3_is_refused(stream_id: int) -> None:
    with pytest.raises(FrameError, match=rf"byte 0: stream id {stream_id} is not 0-3") as info:
        Demuxer().feed(header(stream_id, size=1) + b"x")
    assert info.value.offset == 0


@pytest.mark.parametrize("index", [1, 2, 3])
def test_nonzero_padding_byte_is_refused(index: int) -> None:
    bad_header = bytearray(header(STDOUT, size=1))
    bad_header[index] = 0xAB
    with pytest.raises(FrameError, match=rf"byte {index}: header padding byte {index} is 0xab"):
        Demuxer().feed(bytes(bad_header) + b"x")


def test_error_offset_counts_from_start_of_stream() -> None:
    demuxer = Demuxer()
    assert demuxer.feed(encode_frame(STDOUT, b"hello")) == [(STDOUT, b"hello")]
    demuxer.feed(encode_frame(STDERR, b"")[:1])
    with pytest.raises(FrameError, match=r"byte 15: header padding byte 2 is 0x01") as info:
        demuxer.feed(b"\x00\x01")
    assert info.value.offset == 15


def test_bad_header_is_refused_before_it_is_complete() -> None:
    demuxer = Demuxer()
    with pytest.raises(FrameError, match="stream id 9"):
        demuxer.feed(b"\x09")


def test_error_is_sticky() -> None:
    demuxer = Demuxer()
    with pytest.raises(FrameError):
        demuxer.feed(header(7))
    with pytest.raises(FrameError, match="already failed: stream id 7") as info:
        demuxer.feed(encode_frame(STDOUT, b"fine"))
    assert info.value.offset == 0
    with pytest.raises(FrameError, match="already failed"):
        demuxer.close()


@given(st.lists(st.binary(max_size=30), max_size=8))
def test_arbitrary_bytes_parse_or_raise_frame_error(pieces: list[bytes]) -> None:
    demuxer = Demuxer()
    try:
        for piece in pieces:
            for _, chunk in demuxer.feed(piece):
                assert chunk
        demuxer.close()
    except FrameError:
        pass


@given(frames=frames_strategy.filter(bool), data=st.data())
def test_corrupted_frames_parse_or_raise_frame_error(
    frames: list[Frame], data: st.DataObject
) -> None:
    # Random bytes rarely get past the first header; corrupting one byte of valid input does.
    encoded = bytearray(b"".join(encode_frame(s, p) for s, p in frames))
    encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=6))
    demuxer = Demuxer()
    try:
        for piece in split(bytes(encoded), cuts):
            demuxer.feed(piece)
        demuxer.close()
    except FrameError:
        pass


# --- encode_frame -----------------------------------------------------------------------------


def test_encode_frame_layout() -> None:
    assert encode_frame(STDERR, b"abc") == b"\x02\x00\x00\x00\x00\x00\x00\x03abc"


@pytest.mark.parametrize("stream_id", [-1, 4, 256])
def test_encode_frame_refuses_illegal_stream_id(stream_id: int) -> None:
    with pytest.raises(ValueError, match="stream id must be 0-3"):
        encode_frame(stream_id, b"")
