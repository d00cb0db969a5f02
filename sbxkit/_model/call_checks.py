"""Checks of a public call's own arguments (not the spec's fields), pure and cheap.

A type checker catches ``run(spec, stdin="text")``; a caller without one got an ExceptionGroup
out of the stdin feeder after the container had started. These refuse such arguments as a
``SpecError`` naming the argument, before any engine contact: ``sbxkit.run``,
``sbxkit._consumers.runner.run`` and the session's exec call them first thing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sbxkit._model.textcheck import check_utf8
from sbxkit.errors import SpecError

__all__ = [
    "MAX_POOL_SECONDS",
    "MAX_POOL_SIZE",
    "check_argv",
    "check_pool_options",
    "check_spec_type",
    "check_stdin",
]


def check_argv(argv: Sequence[str]) -> list[str]:
    """A command's argv (``Sandbox.exec``, ``Sandbox.start``) as a list: non-empty strings
    without NUL, valid UTF-8."""
    if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
        raise SpecError("argv", "must be a non-empty list of arguments")
    for index, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise SpecError(f"argv[{index}]", "must be a string")
        if "\0" in arg:
            raise SpecError(f"argv[{index}]", "must not contain NUL")
    if argv[0] == "":
        raise SpecError("argv[0]", "the program name must not be empty")
    check_utf8(list(argv), "argv")
    return list(argv)


def check_stdin(stdin: object, field: str = "stdin", *, streams: bool = False) -> None:
    """Refuse a ``stdin`` that is not bytes-like or None — or, where ``streams`` are taken (a
    one-shot run), a ``trio.abc.ReceiveStream``; text gets a hint: the payload reads bytes, and
    which encoding is the caller's choice."""
    if stdin is None or isinstance(stdin, bytes | bytearray | memoryview):
        return
    if streams and callable(getattr(stdin, "receive_some", None)):
        return  # a trio ReceiveStream (duck-typed: this module stays free of trio)
    if isinstance(stdin, str):
        raise SpecError(field, "must be bytes or None, got str (encode it, e.g. text.encode())")
    kinds = "bytes, a trio ReceiveStream or None" if streams else "bytes or None"
    raise SpecError(field, f"must be {kinds}, got {type(stdin).__name__}")


def check_spec_type(spec: object, expected: type, field: str = "spec") -> None:
    """Refuse a spec argument that is not an ``expected`` (a dict, a profile, None ...)."""
    if not isinstance(spec, expected):
        raise SpecError(
            field,
            f"must be a {expected.__name__}, got {type(spec).__name__} (build one, or "
            "use sbxkit._model.spec_from_dict for decoded JSON/TOML)",
        )


MAX_POOL_SIZE = 256
MAX_POOL_SECONDS = 30 * 24 * 3600.0


def check_pool_options(
    size: object, idle_ttl_s: object, max_timeout_s: object, prefix: str = "pool"
) -> None:
    """The pool's own settings (pure): ``SpecError`` naming ``{prefix}.size`` and so on."""
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_POOL_SIZE:
        raise SpecError(f"{prefix}.size", f"must be an integer from 1 to {MAX_POOL_SIZE}")
    for name, value in (("idle_ttl", idle_ttl_s), ("max_timeout", max_timeout_s)):
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not 0 < value <= MAX_POOL_SECONDS
        ):
            raise SpecError(
                f"{prefix}.{name}", f"must be a number of seconds > 0 and <= {MAX_POOL_SECONDS:g}"
            )
