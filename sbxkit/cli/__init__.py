"""The ``sbxkit`` command line, as a package: one module a subcommand, no import cycles.

- ``parser``: the parser, and ``main()`` (the ``sbxkit`` console script's full path);
- ``shell``, ``batch`` (+ ``jobs``, ``results``, ``progress``), ``admin`` (supervisor, leases,
  pools), ``cluster``, ``mcp``, ``demo``: a module a subcommand;
- ``sessions``: ``open`` and the commands naming an open sandbox (``exec``, ``logs``, ``write``,
  ``wait``, ``kill``, ``ps``, ``sessions``, ``cp``, ``close``), with the holder process each
  open session runs (``_session_holder``), the client side (``_session_client``) and the
  frames between them (``_session_wire``).

What they share — exit statuses, errors at the boundary, the signal→cancel bridge, the flag table
and ``sbxkit run``'s grammar — is ``sbxkit._grammar``. Names load on first use (PEP 562), as in
``sbxkit.pool``: importing one subcommand's module loads neither the others nor ``main``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbxkit._util.lazy import lazy_names

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

_ELSEWHERE = {
    "spec_from_args": "sbxkit._grammar.flags",
    "build_parser": "sbxkit.cli.parser",
    "main": "sbxkit.cli.parser",
}
_WHERE = {name: _ELSEWHERE.get(name, "sbxkit._grammar.common") for name in __all__}
"""Each public name and the module it loads from: the shared CLI code unless named here."""


__getattr__ = lazy_names(__name__, _WHERE, globals())
