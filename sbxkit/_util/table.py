"""Fixed-width text tables for the operator commands (pure): each column's header and cells
laid out by the one format spec it is declared with, two spaces between columns."""

from __future__ import annotations

__all__ = ["Table"]


class Table:
    """Columns as ``(header, spec)`` pairs, e.g. ``("SIZE", ">4")``; the last one usually has
    the spec ``""`` (unpadded: a free-length text ends the line)."""

    def __init__(self, *columns: tuple[str, str]) -> None:
        self.specs = [spec for _, spec in columns]
        self.header = self.line(*(header for header, _ in columns))

    def line(self, *cells: object) -> str:
        """One line: each cell in its column's spec; fewer cells than columns fill the first
        ones only (the caller goes on with text of its own)."""
        return "  ".join(format(cell, spec) for cell, spec in zip(cells, self.specs, strict=False))
