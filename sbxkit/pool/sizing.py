"""How many containers a batch keeps parked per shape (pure; ``shapes.py`` applies it).

A batch starts its jobs in input order, at most ``parallel`` at a time, so the containers worth
parking are those of the next ``parallel`` jobs still to start: each shape gets one per job of
it in that window, at most ``per_shape``. The sizes therefore sum to at most ``parallel``, a
shape never holds more than its jobs still to start, and a shape whose jobs have all started
gets none (its pool closes and its admission memory returns).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

__all__ = ["pool_sizes"]

K = TypeVar("K", bound=Hashable)


def pool_sizes(pending: Iterable[K], parallel: int, per_shape: int) -> dict[K, int]:
    """Parked containers per shape for ``pending``: the shapes of the jobs still to start that
    a pool can serve, in the order they will start. Shapes not in the result get 0."""
    sizes: dict[K, int] = {}
    for position, shape in enumerate(pending):
        if position >= parallel:
            break
        sizes[shape] = min(sizes.get(shape, 0) + 1, per_shape)
    return sizes
