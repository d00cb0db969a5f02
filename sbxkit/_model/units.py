"""Sizes and durations as a user writes them: the one parser of each, for flags, profiles and
batch jobs alike (pure: text in, a number or ``SpecError`` out).

**Sizes** are read as Docker reads ``--memory`` (go-units ``RAMInBytes``): a decimal number,
an optional single space, then an optional unit ``b``, ``k``, ``m``, ``g``, ``t`` or ``p``,
which may be followed by ``b`` or ``ib`` — every unit binary, so ``64m``, ``64mb``, ``64MB``
and ``64MiB`` are all 64 MiB, case-insensitive. A bare number is bytes. A fraction is allowed
(``1.5g``) and the result is truncated to whole bytes, as Docker truncates it (``0.1k`` is 102
bytes). Docker's parser also takes an exponent (``2e3``) by accident of ``strconv.ParseFloat``;
sbxkit does not, so ``1e3k`` is refused rather than read as a megabyte.

**Durations**: a bare number is seconds (``30``, ``0.5``); otherwise one or more terms of a
number and a unit ``ms``, ``s``, ``m`` or ``h`` (``500ms``, ``30s``, ``5m``, ``1h``,
``1h30m``), as Go's ``time.ParseDuration`` writes them.

The numbers are ASCII: ``١٢m`` is refused, not read as 12 MiB (sbxkit/_util/argtypes.py).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from sbxkit._util.argtypes import MAX_NUMBER_CHARS, ascii_float
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = [
    "GiB",
    "KiB",
    "MiB",
    "TiB",
    "parse_duration",
    "parse_size",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

INT64_MAX = 2**63 - 1
"""Docker stores byte counts as int64; larger values overflow in the daemon."""

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SIZE_RE = re.compile(rf"({_NUMBER}) ?([a-z]*)", re.ASCII)
_SIZE_UNITS = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB, "p": 1024 * TiB}
SIZE_HINT = (
    "a number and an optional unit b, k, m, g, t or p, binary as Docker reads them: "
    "64m, 1.5g, 512KiB"
)

_TERM_RE = re.compile(rf"({_NUMBER})([a-z]*)", re.ASCII)
_DURATION_RE = re.compile(rf"(?:{_NUMBER}[a-z]+)+", re.ASCII)
_DURATION_UNITS = {
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}

DURATION_HINT = "seconds, or a number with a unit ms, s, m or h: 30, 0.5, 500ms, 30s, 5m, 1h30m"


def _size_unit(unit: str) -> int | None:
    """``k``, ``kb`` and ``kib`` are the same binary unit (as for Docker); None: no such unit."""
    if unit in _SIZE_UNITS:
        return _SIZE_UNITS[unit]
    prefix, rest = unit[:1], unit[1:]
    if prefix == "b" or rest not in ("b", "ib"):
        return None  # "bb", "kx", "kbytes"
    return _SIZE_UNITS.get(prefix)


def parse_size(text: object, field: str) -> int:
    """A byte count from ``text`` such as ``"256m"``, ``"1.5g"``, ``"64MB"``, ``"1t"`` or
    ``"1024"`` (bytes); ``SpecError(field, ...)`` otherwise. The range of the field it sets is
    its own rule (``check_limit``)."""
    if not isinstance(text, str):
        raise SpecError(field, f"a size must be a string such as '256m' ({SIZE_HINT})")
    cleaned = text.strip().lower()
    if not cleaned:
        raise SpecError(field, f"size is empty ({SIZE_HINT})")
    if cleaned.startswith("-"):
        raise SpecError(field, f"negative sizes are refused: {text!r}")
    match = _SIZE_RE.fullmatch(cleaned) if len(cleaned) <= MAX_NUMBER_CHARS else None
    if match is None:
        raise SpecError(field, f"not a size: {text!r} ({SIZE_HINT})")
    number, unit = match.groups()
    multiplier = _size_unit(unit)
    if multiplier is None:
        raise SpecError(field, f"unknown unit {unit!r} in {text!r} ({SIZE_HINT})")
    size = math.floor(Fraction(number) * multiplier)
    if size > INT64_MAX:
        raise SpecError(field, f"size {text!r} exceeds {INT64_MAX} bytes")
    return size


def parse_duration(text: object, field: str) -> float:
    """Seconds from ``text`` such as ``"30"``, ``"0.5"``, ``"500ms"``, ``"5m"`` or ``"1h30m"``;
    an int or float passes as seconds (a profile's ``timeout = 30``). ``SpecError(field, ...)``
    otherwise; whether the value is in range is the field's own rule. ``inf`` and ``nan`` parse
    as bare numbers, for that rule to name them."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise SpecError(field, f"a duration must be a number or a string ({DURATION_HINT})")
    if not isinstance(text, str):
        return float(text)
    cleaned = text.strip(" \t").lower()
    if not cleaned:
        raise SpecError(field, f"duration is empty ({DURATION_HINT})")
    if cleaned.startswith("-"):
        raise SpecError(field, f"negative durations are refused: {text!r}")
    try:
        return ascii_float(cleaned)
    except ValueError:
        pass
    if len(cleaned) > MAX_NUMBER_CHARS or _DURATION_RE.fullmatch(cleaned) is None:
        raise SpecError(field, f"not a duration: {text!r} ({DURATION_HINT})")
    seconds = Fraction(0)
    for number, unit in _TERM_RE.findall(cleaned):
        if unit not in _DURATION_UNITS:
            raise SpecError(field, f"unknown unit {unit!r} in {text!r} ({DURATION_HINT})")
        seconds += Fraction(number) * _DURATION_UNITS[unit]
    return float(seconds)


_SIZE_NAMES = ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"))


def format_size(size: int) -> str:
    """A byte count as a person reads it: ``256 MiB``, ``1.5 GiB``, ``100 bytes`` (binary units,
    as ``parse_size`` reads them; at most two decimals)."""
    for unit, name in _SIZE_NAMES:
        if size >= unit:
            return f"{size / unit:.2f}".rstrip("0").rstrip(".") + f" {name}"
    return f"{size} bytes" if size != 1 else "1 byte"


def format_seconds(seconds: float) -> str:
    """A duration as a person reads it: ``30 s``, ``0.5 s``, ``1.25 s`` (at most three decimals)."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + " s"


publish(__name__, globals())  # public names show as sbxkit.NAME
