"""The pure parts of background processes (sbxkit/_consumers/processes.py): the output log
read by cursor, ``ProcessExit``, and the checks of each call's arguments — each refused as a
``SpecError`` naming the argument and the rule, before anything reaches the daemon."""

from __future__ import annotations

import math
import signal as signals

import msgspec

from sbxkit._model.result import Status
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = [
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_READ_BYTES",
    "OutputLog",
    "ProcessExit",
    "check_max_processes",
    "check_read",
    "check_seconds",
    "check_signal",
    "check_terminal_size",
]

DEFAULT_MAX_PROCESSES = 16
DEFAULT_READ_BYTES = 64 * 1024


class OutputLog:
    """A process's merged output: every byte up to ``cap``, read by absolute cursor. Pure."""

    def __init__(self, cap: int) -> None:
        if cap < 0:
            raise ValueError(f"cap must be >= 0, got {cap}")
        self._cap = cap
        self._data = bytearray()
        self.overflowed = False

    @property
    def size(self) -> int:
        """Bytes kept so far: the cursor after everything."""
        return len(self._data)

    def add(self, data: bytes) -> bool:
        """Keep ``data`` up to the cap; True only when this is the first byte past it."""
        room = self._cap - len(self._data)
        self._data += data[: max(room, 0)]
        if len(data) <= room or self.overflowed:
            return False
        self.overflowed = True
        return True

    def read(self, cursor: int, max_bytes: int) -> tuple[bytes, int]:
        """``(bytes from cursor, next cursor)``; ``check_read`` refused a bad cursor first."""
        chunk = bytes(self._data[cursor : cursor + max_bytes])
        return chunk, cursor + len(chunk)


def check_read(cursor: object, max_bytes: object, wait: object, size: int) -> None:
    """Refuse ``read`` arguments that are not what they must be, naming each."""
    if isinstance(cursor, bool) or not isinstance(cursor, int) or not 0 <= cursor <= size:
        raise SpecError("cursor", f"must be an int from 0 to {size} (bytes so far), got {cursor!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise SpecError("max_bytes", f"must be an int >= 1, got {max_bytes!r}")
    check_seconds("wait", wait)


def check_seconds(field: str, value: object, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        kind = "a finite number of seconds >= 0" + (" or None" if optional else "")
        raise SpecError(field, f"must be {kind}, got {value!r}")


def check_signal(sig: object) -> int:
    """``15``, ``"TERM"``, ``"SIGTERM"`` or ``signal.SIGTERM`` → 15; anything else refused."""
    if isinstance(sig, bool):
        raise SpecError("sig", f"must be a signal number or name, got {sig!r}")
    if isinstance(sig, int):
        try:
            return int(signals.Signals(sig))
        except ValueError:
            raise SpecError("sig", f"{sig} is not a signal number on this host") from None
    if isinstance(sig, str):
        name = sig.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            return int(signals.Signals[name])
        except KeyError:
            raise SpecError("sig", f"{sig!r} is not a signal name (e.g. TERM, INT)") from None
    raise SpecError("sig", f"must be a signal number or name, got {type(sig).__name__}")


def check_max_processes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError("max_processes", f"must be an int >= 1, got {value!r}")
    return value


def check_terminal_size(rows: object, columns: object) -> None:
    for field, value in (("rows", rows), ("columns", columns)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            raise SpecError(field, f"must be an int from 1 to 65535, got {value!r}")


class ProcessExit(msgspec.Struct, frozen=True, kw_only=True):
    """How a background process ended (``Process.wait``), judged as for ``Sandbox.exec``.

    ``exit_code`` is the process's own only when ``status`` is ``exited``. ``output_bytes``:
    the merged output kept (all of it, unless ``output_exceeded``). ``run_s``: start to end.
    """

    status: Status
    exit_code: int | None
    output_bytes: int
    run_s: float
    oom_evidence: str | None = None
    kill_evidence: str | None = None


publish(__name__, globals())  # public names show as sbxkit.NAME
