"""The interpreter's framing (sbxkit/_consumers/interp_frames.py): bounded before buffered,
checked against a closed set of shapes, and a refusal is final."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from sbxkit._consumers.interp_frames import (
    FrameDecoder,
    FrameRefused,
    Out,
    Ready,
    Reply,
    check_preload,
    encode_request,
    frame_bound,
)
from sbxkit.errors import SpecError


def frame(obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


READY = frame({"t": "ready", "python": "3.11.2"})
OUT = frame({"t": "out", "id": 1, "s": "stdout", "d": base64.b64encode(b"hi\n").decode()})
RESULT = frame({"t": "result", "id": 1, "value": {"text/plain": "42"}, "error": None})


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    stream = READY + OUT + RESULT
    for step in (1, 3, 7, len(stream)):
        decoder = FrameDecoder(1024)
        got: list[object] = []
        for at in range(0, len(stream), step):
            got += decoder.feed(stream[at : at + step])
        assert [type(f) for f in got] == [Ready, Out, Reply]
        assert decoder.pending == 0
    assert got[2] == Reply(id=1, value={"text/plain": "42"}, error=None)


def test_a_length_over_the_bound_is_refused_before_its_bytes_arrive() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(FrameRefused, match="over the bound of 100"):
        decoder.feed(struct.pack(">I", 101))  # the header alone: nothing more is awaited
    assert decoder.pending == 0
    with pytest.raises(FrameRefused):  # final: even a good frame is refused after it
        decoder.feed(READY)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"not json", "malformed"),
        (b"[1, 2]", "malformed"),
        (b'{"t": "shell", "cmd": "rm -rf /"}', "malformed"),
        (b'{"t": "result", "id": "1", "value": null, "error": null}', "malformed"),
        (b'{"t": "result", "id": 1, "value": {"text/plain": 42}, "error": null}', "malformed"),
        (b'{"t": "out", "id": 1, "s": "stdin", "d": ""}', "malformed"),
        (b'{"t": "out", "id": 1, "s": "stdout", "d": "***"}', "not base64"),
        (b'{"t": "result", "id": 1, "value": null, "error": {"name": "E"}}', "malformed"),
        (b"\xff\xfe", "malformed"),
    ],
)
def test_anything_but_a_known_shape_is_refused(body: bytes, why: str) -> None:
    decoder = FrameDecoder(1024)
    with pytest.raises(FrameRefused, match=why):
        decoder.feed(struct.pack(">I", len(body)) + body)


def test_an_incomplete_frame_waits_and_holds_at_most_the_bound() -> None:
    decoder = FrameDecoder(1024)
    assert decoder.feed(RESULT[:-1]) == []
    assert decoder.pending == len(RESULT) - 1
    assert len(decoder.feed(RESULT[-1:])) == 1


def test_requests_round_trip_and_the_bound_grows_with_the_cap() -> None:
    request = encode_request(7, "x = 'é'\nx", 100)
    (size,) = struct.unpack(">I", request[:4])
    assert size == len(request) - 4
    assert json.loads(request[4:]) == {"id": 7, "code": "x = 'é'\nx", "cap": 100}
    assert frame_bound(1) < frame_bound(1024 * 1024)
    # A result whose every text is at the cap, escaped at worst, still fits the bound.
    worst = "\x00" * 100
    reply = {"t": "result", "id": 1, "value": dict.fromkeys("abcde", worst), "error": None}
    reply["error"] = {"name": worst, "value": worst, "traceback": worst}
    assert len(frame(reply)) <= frame_bound(100)


@pytest.mark.parametrize(
    ("preload", "rule"),
    [
        ("numpy", "must be a list of module names, got str"),
        ({"numpy"}, "must be a list of module names, got set"),
        (["numpy", "os; import x"], "'os; import x' is not a module name"),
        (["-m"], "'-m' is not a module name"),
        ([""], "'' is not a module name"),
        (["a..b"], "'a..b' is not a module name"),
        ([3], "3 is not a module name"),
        (["m"] * 65, "must name at most 64 modules"),
    ],
)
def test_preload_is_refused_naming_what_was_typed(preload: object, rule: str) -> None:
    with pytest.raises(SpecError, match=r"^preload: ") as refused:
        check_preload(preload)
    assert rule in str(refused.value)


def test_preload_takes_dotted_module_names() -> None:
    assert check_preload(["numpy", "xml.etree.ElementTree"]) == ("numpy", "xml.etree.ElementTree")
    assert check_preload(()) == ()


def test_a_ready_frame_may_say_its_preload_failed_and_a_result_carries_displays() -> None:
    failed = frame({"t": "ready", "python": "3.11.2", "preload_error": "nope: ImportError: x"})
    (ready,) = FrameDecoder(1 << 20).feed(failed)
    assert isinstance(ready, Ready)
    assert ready.preload_error == "nope: ImportError: x"
    shown = {"text/plain": "<Figure>", "image/png": base64.b64encode(b"png").decode()}
    body = {"t": "result", "id": 1, "value": None, "error": None, "displays": [shown]}
    (reply,) = FrameDecoder(1 << 20).feed(frame(body))
    assert isinstance(reply, Reply)
    assert reply.displays == [shown]
    with pytest.raises(FrameRefused, match="malformed"):
        FrameDecoder(1 << 20).feed(frame({**body, "displays": [{"image/png": 3}]}))
