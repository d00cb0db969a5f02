"""Text that can travel: every string of a spec must encode as UTF-8, within a sane depth.

A byte that is not UTF-8 in ``sys.argv`` (``sbxkit run IMG -- echo $'\\xff'``) reaches Python as
a lone surrogate (``'\\udcff'``, PEP 383), and so does a surrogate a caller writes in Python.
Neither can be encoded for the Engine API's JSON or the supervisor's wire: left alone it ends as
a ``UnicodeEncodeError`` deep in a send. ``check_utf8`` finds the first such string in a spec
(keys and values, lists, nested structs) and names it by its field path, before anything runs.
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from sbxkit.errors import SpecError

__all__ = ["MAX_DEPTH", "check_utf8", "utf8_problem"]

MAX_DEPTH = 32
"""A spec is a few levels deep (spec → mounts → mount → options); deeper is not a spec."""


def utf8_problem(text: str) -> str | None:
    """Why ``text`` cannot be sent as UTF-8 (a lone surrogate, or a non-UTF-8 byte from the
    command line), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        if 0xDC80 <= ord(char) <= 0xDCFF:
            byte = ord(char) - 0xDC00
            what = f"the byte 0x{byte:02x}, which is not UTF-8 (from the command line or a file)"
        else:
            what = f"a lone surrogate U+{ord(char):04X}"
        return f"must be valid UTF-8 text; character {error.start} is {what}"
    return None


def _walk(value: object, field: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SpecError(field, f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        problem = utf8_problem(value)
        if problem is not None:
            raise SpecError(field, problem)
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _walk(getattr(value, name), f"{field}.{name}" if field else name, depth + 1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{field}[{key!r}]"
            _walk(key, f"{where} (key)", depth + 1)
            _walk(item, where, depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _walk(item, f"{field}[{index}]", depth + 1)


def check_utf8(value: object, field: str = "") -> None:
    """Refuse the first string in ``value`` (a struct, mapping, list or str) that is not
    encodable as UTF-8, naming its path (``command[1]``, ``env['K']``, ``workdir``)."""
    _walk(value, field, 0)
