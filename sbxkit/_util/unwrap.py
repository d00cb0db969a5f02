"""No exception group escapes a public call.

trio nurseries raise ``BaseExceptionGroup`` (``strict_exception_groups`` is trio's default),
even for one error. sbxkit promises plain errors — every failure is an ``SbxError``, Ctrl-C is
a plain ``KeyboardInterrupt`` — so each nursery on a public path is wrapped in
``plain_errors()``, which re-raises the one exception that matters. Pure apart from raising.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import trio

P = ParamSpec("P")
T = TypeVar("T")


def leaves(error: BaseException) -> list[BaseException]:
    """Every non-group exception inside ``error``, depth first, in order."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def chosen_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception a caller should see instead of ``group``.

    Ctrl-C wins (the user asked to stop; everything else is fallout), then SystemExit, then the
    first real error — ``Cancelled`` only when nothing else happened, so an outer cancel scope
    still catches it. Other errors stay reachable through ``__context__`` of the group.
    """
    found = leaves(group)
    for kind in (KeyboardInterrupt, SystemExit):
        for leaf in found:
            if isinstance(leaf, kind):
                return leaf
    for leaf in found:
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return found[0]


class _Plain:
    """Context manager form; a class (not @contextmanager) so the re-raise keeps the leaf's
    own traceback and cause rather than a generator frame's."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: BaseException | None, tb: object) -> None:
        if isinstance(value, BaseExceptionGroup):
            leaf = chosen_leaf(value)
            # ``from`` the leaf's own cause: the group is hidden from the printed chain but
            # remains the leaf's __context__ for debugging.
            raise leaf from leaf.__cause__


def plain_errors() -> _Plain:
    """``with plain_errors(): async with trio.open_nursery() ...`` — see the module doc."""
    return _Plain()


def plain_async(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Decorate a public coroutine function whose nurseries live in code it calls."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with plain_errors():
            return await func(*args, **kwargs)

    return wrapper
