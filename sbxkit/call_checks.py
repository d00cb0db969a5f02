"""Checks of a public call's own arguments (not the spec's fields), pure and cheap.

A type checker catches ``run(spec, stdin="text")``; a caller without one got an ExceptionGroup
out of the stdin feeder after the container had started. These refuse such arguments as a
``SpecError`` naming the argument, before any engine contact: ``sbxkit.run``,
``sbxkit.runner.run`` and the session's exec call them first thing.
"""

from __future__ import annotations

from sbxkit.errors import SpecError

__all__ = ["check_spec_type", "check_stdin"]


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
            "use sbxkit.spec_from_dict for decoded JSON/TOML)",
        )
