"""Predicates every rule shares, defined once (pure).

A *control character* is Unicode category Cc: C0 (U+0000–U+001F), DEL (U+007F) and C1
(U+0080–U+009F). Every field that refuses control characters — image references, paths,
environment, labels, profile values, ``sbx`` arguments, grant names — refuses exactly these.
"""

from __future__ import annotations

import re

# Category Cc is exactly these two ranges (a unit test checks every code point against
# ``unicodedata``); one regex search is a tenth of a per-character category lookup.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def has_control(text: str) -> bool:
    """True if any character of ``text`` is a control character (C0, DEL or C1)."""
    return _CONTROL.search(text) is not None


__all__ = ["has_control"]
