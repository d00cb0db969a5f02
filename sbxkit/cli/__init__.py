"""The ``sbxkit`` command line, as a package: one module a subcommand, no import cycles.

- ``parser``: the parser, and ``main()`` (the ``sbxkit`` console script's full path);
- ``shell``, ``batch`` (+ ``jobs``, ``results``, ``progress``), ``admin`` (supervisor, leases,
  pools), ``cluster``, ``mcp``, ``demo``: a module a subcommand.

What they share — exit statuses, errors at the boundary, the signal→cancel bridge, the flag table
and ``sbxkit run``'s grammar — is ``sbxkit._grammar``. Names load on first use (PEP 562), as in
``sbxkit.pool``: importing one subcommand's module loads neither the others nor ``main``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sbxkit._grammar.common import (
        EXIT_CAPACITY,
        EXIT_CLEANUP_FAILED,
        EXIT_ENGINE_UNAVAILABLE,
        EXIT_INTERNAL,
        EXIT_OOM_KILLED,
        EXIT_OUTPUT_EXCEEDED,
        EXIT_REFUSED,
        EXIT_SIGINT,
        EXIT_TIMED_OUT,
        STATUS_EXIT,
        Interrupted,
        exit_code_for,
        exit_code_for_error,
        exit_with,
        to_json,
    )
    from sbxkit._grammar.flags import spec_from_args
    from sbxkit.cli.parser import build_parser, main

_COMMON = "sbxkit._grammar.common"
_WHERE = {
    **dict.fromkeys(
        (
            "EXIT_CAPACITY",
            "EXIT_CLEANUP_FAILED",
            "EXIT_ENGINE_UNAVAILABLE",
            "EXIT_INTERNAL",
            "EXIT_OOM_KILLED",
            "EXIT_OUTPUT_EXCEEDED",
            "EXIT_REFUSED",
            "EXIT_SIGINT",
            "EXIT_TIMED_OUT",
            "STATUS_EXIT",
            "Interrupted",
            "exit_code_for",
            "exit_code_for_error",
            "exit_with",
            "to_json",
        ),
        _COMMON,
    ),
    "spec_from_args": "sbxkit._grammar.flags",
    "build_parser": "sbxkit.cli.parser",
    "main": "sbxkit.cli.parser",
}

__all__ = [
    "EXIT_CAPACITY",
    "EXIT_CLEANUP_FAILED",
    "EXIT_ENGINE_UNAVAILABLE",
    "EXIT_INTERNAL",
    "EXIT_OOM_KILLED",
    "EXIT_OUTPUT_EXCEEDED",
    "EXIT_REFUSED",
    "EXIT_SIGINT",
    "EXIT_TIMED_OUT",
    "STATUS_EXIT",
    "Interrupted",
    "build_parser",
    "exit_code_for",
    "exit_code_for_error",
    "exit_with",
    "main",
    "spec_from_args",
    "to_json",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'sbxkit.cli' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
