"""argparse types the command lines share (``sbxkit`` and the supervisor's), and the one
number grammar of every flag: ASCII digits only.

Python's ``int()`` and ``float()`` also read other scripts' digits (``int("١٢")`` is 12) and
underscores (``1_000``) and Unicode spaces around them; a limit is written in ASCII (spaces and
tabs around it are allowed), so anything else is refused rather than read as something the user
may not have meant.
"""

from __future__ import annotations

import argparse
import math
import re

_INT = re.compile(r"\+?[0-9]+", re.ASCII)
_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)
_ASCII_SPACE = " \t"
MAX_NUMBER_CHARS = 64
"""No limit needs more characters; longer text is refused before it is converted."""


def ascii_int(text: str) -> int:
    """An integer of ASCII digits (a leading ``+`` allowed); ValueError otherwise."""
    text = text.strip(_ASCII_SPACE)
    if len(text) > MAX_NUMBER_CHARS or not _INT.fullmatch(text):
        raise ValueError(f"not an integer of ASCII digits: {text!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """A decimal number of ASCII digits (``1``, ``0.5``, ``2e3``); ValueError otherwise.
    ``inf`` and ``nan`` parse, for the caller's finiteness rule to name them."""
    text = text.strip(_ASCII_SPACE)
    if len(text) > MAX_NUMBER_CHARS or not _FLOAT.fullmatch(text):
        raise ValueError(f"not a decimal number of ASCII digits: {text!r}")
    return float(text)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    try:
        value = ascii_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
