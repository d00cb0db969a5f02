"""``sbxkit.mcp.output_feed``: output chunks become progress messages without losing, splitting
or reordering a character, whatever the cuts and threads."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from sbxkit.mcp.output_feed import OutputFeed


@given(st.text(), st.lists(st.integers(min_value=0, max_value=64), max_size=20))
def test_text_cut_at_any_byte_comes_back_exact(text: str, cuts: list[int]) -> None:
    data = text.encode("utf-8")
    feed = OutputFeed()
    taken: list[str] = []
    at = 0
    for size in cuts:
        feed.add("stdout", data[at : at + size])
        at += size
        taken += [piece for _, piece in feed.take()]
    feed.add("stdout", data[at:])
    taken += [piece for _, piece in feed.take(final=True)]
    assert "".join(taken) == text
    assert "\ufffd" not in "".join(taken) or "\ufffd" in text
    assert feed.bytes == len(data)


def test_runs_of_one_stream_are_one_message_in_arrival_order() -> None:
    feed = OutputFeed()
    for stream, chunk in [("stdout", b"a"), ("stdout", b"b"), ("stderr", b"!"), ("stdout", b"c")]:
        feed.add(stream, chunk)  # type: ignore[arg-type]
    assert feed.take() == [("stdout", "ab"), ("stderr", "!"), ("stdout", "c")]
    assert feed.take() == []


def test_a_split_character_waits_and_a_truncated_one_ends_as_a_replacement() -> None:
    feed = OutputFeed()
    euro = "€".encode()
    feed.add("stdout", b"x" + euro[:1])
    assert feed.take() == [("stdout", "x")]
    feed.add("stdout", euro[1:])
    assert feed.take() == [("stdout", "€")]
    feed.add("stderr", euro[:2])
    assert feed.take() == []
    assert feed.take(final=True) == [("stderr", "\ufffd")]


def test_two_threads_lose_nothing() -> None:
    feed = OutputFeed()
    taken: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            taken.extend(piece for _, piece in feed.take())
        taken.extend(piece for _, piece in feed.take(final=True))

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(5000):
        feed.add("stdout", f"{i},".encode())
    done.set()
    thread.join()
    assert "".join(taken) == "".join(f"{i}," for i in range(5000))
