"""Bench-side call timing: wrap an object's async methods on the *instance* to time each call.

Used by ``--profile`` runs to say which of sbxkit's calls cost what without touching sbxkit:
the wrappers replace bound methods on one engine or owner object and cost microseconds.
Calls nest (an owner's ``create`` contains its ``connect``); only top-level calls are
subtracted from a run's wall time to give the time spent outside any traced call.
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

OUTSIDE = "(outside traced calls)"


def public_async_methods(obj: object, exclude: Iterable[str] = ("aclose",)) -> list[str]:
    """Names of ``obj``'s public coroutine methods (so calls added to sbxkit later are timed
    too, not silently lumped into ``OUTSIDE``)."""
    skip = set(exclude)
    return [
        name
        for name, member in inspect.getmembers(type(obj))
        if not name.startswith("_") and name not in skip and inspect.iscoroutinefunction(member)
    ]


class CallTracer:
    def __init__(self) -> None:
        self._calls: list[tuple[float, str, float, int]] = []  # start, label, seconds, depth
        self._depth = 0
        self.rows: dict[str, list[dict[str, float]]] = {}

    def wrap(self, obj: object, names: Iterable[str], prefix: str) -> None:
        """Replace each ``obj.name`` (an async method) by a timed wrapper labelled prefix+name."""
        for name in names:
            method = getattr(obj, name)
            post = self._wrap_waiter if name == "container_wait" else None
            setattr(obj, name, self._timed(prefix + name, method, post))

    def _wrap_waiter(self, waiter: object) -> None:
        self.wrap(waiter, ["result"], "wait.")

    def _timed(
        self,
        label: str,
        method: Callable[..., Awaitable[Any]],
        post: Callable[[Any], None] | None,
    ) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            depth = self._depth
            self._depth += 1
            t0 = time.perf_counter()
            try:
                result = await method(*args, **kwargs)
            finally:
                self._depth = depth
                self._calls.append((t0, label, time.perf_counter() - t0, depth))
            if post is not None:
                post(result)
            return result

        return timed

    def begin(self) -> None:
        self._calls = []
        self._depth = 0

    def end(self, key: str, total_s: float) -> None:
        """File this run's calls under ``key``: repeated labels get ``#2``, ``#3``; nested ones
        are indented; the rest of the wall time is ``OUTSIDE``."""
        seen: dict[str, int] = {}
        row: dict[str, float] = {}
        for _, label, seconds, depth in sorted(self._calls):
            seen[label] = seen.get(label, 0) + 1
            name = label if seen[label] == 1 else f"{label}#{seen[label]}"
            row["  " * depth + name] = seconds
        row[OUTSIDE] = total_s - sum(s for _, _, s, depth in self._calls if depth == 0)
        self.rows.setdefault(key, []).append(row)
        self._calls = []

    def medians_ms(self, key: str) -> dict[str, float]:
        """Median ms per call label, in the order the calls happened."""
        columns: dict[str, list[float]] = {}
        for row in self.rows.get(key, []):
            for name, seconds in row.items():
                columns.setdefault(name, []).append(seconds)
        ordered = [name for name in columns if name != OUTSIDE] + [OUTSIDE]
        return {
            name: statistics.median(columns[name]) * 1000.0 for name in ordered if name in columns
        }
