"""A daemon's answer to ``/_ping``, and the answers of the last few seconds, so an engine
opened again soon after on the same socket need not ask again.

An answer stands for ``RECENT_PING_S``, and only while the socket is the same file (device,
inode and change time: an inode number is reused at once, the change time of a socket made
later is not): a restarted daemon makes a new socket, so the next engine pings it afresh. A
connection to the socket that fails forgets what it answered (``forget``, from the transport),
so a daemon that died behind its old socket file is reported as unavailable by the next
``connect``, as without the cache. Plain state, no I/O but a ``stat``.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import msgspec

RECENT_PING_S = 10.0
"""How long a ping's answer stands for the next engine opened on the same socket (as long as
a one-shot run reuses its image's inspection)."""


class PingResult(msgspec.Struct, frozen=True):
    socket_path: str
    api_version: str
    os_type: str = ""
    podman_api_version: str | None = None

    @property
    def is_podman(self) -> bool:
        return self.podman_api_version is not None


def socket_identity(path: str) -> tuple[int, int, int] | None:
    """The socket file's (device, inode, change time), or None if nothing is at ``path``."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns


class _Answer(NamedTuple):
    identity: tuple[int, int, int]
    at: float
    ping: PingResult


_ANSWERS_KEPT = 256
_answers: dict[tuple[str, ...], _Answer] = {}
"""Keyed by the question: the candidate sockets, in the order they are tried. Bounded as the
image inspections are (``plan._image_facts``): a process that asks more questions starts
afresh."""


def recent(question: tuple[str, ...]) -> PingResult | None:
    """The answer to ``question`` of the last ``RECENT_PING_S``, if its socket is the same."""
    answer = _answers.get(question)
    if answer is None:
        return None
    fresh = time.monotonic() - answer.at < RECENT_PING_S
    if fresh and socket_identity(answer.ping.socket_path) == answer.identity:
        return answer.ping
    del _answers[question]
    return None


def remember(question: tuple[str, ...], ping: PingResult) -> None:
    identity = socket_identity(ping.socket_path)
    if identity is None:
        return
    if len(_answers) >= _ANSWERS_KEPT:
        _answers.clear()
    _answers[question] = _Answer(identity, time.monotonic(), ping)


def forget(socket_path: str) -> None:
    """A connection to ``socket_path`` failed: drop every answer it gave."""
    for question in [q for q, a in _answers.items() if a.ping.socket_path == socket_path]:
        del _answers[question]
