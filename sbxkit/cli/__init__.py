"""The ``sbxkit`` command line, as a package: one module a subcommand, no import cycles.

- ``common``: exit statuses, errors at the boundary, the one signal→cancel bridge;
- ``flags``: the one flag table and ``IMAGE -- CMD`` positional of run, shell and batch;
- ``run_command``, ``shell``, ``batch`` (+ ``jobs``), ``admin`` (supervisor, leases, pools, demo);
- ``main``: the parser, and ``main()`` (the ``sbxkit`` console script).
"""

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
from sbxkit.cli.main import build_parser, main

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
