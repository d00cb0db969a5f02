"""``sbxkit``'s parser: the subcommands wired together, and ``main``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

from sbxkit._grammar.common import EXIT_REFUSED, Parser, exit_with, subcommand_parser
from sbxkit._grammar.docker_habits import advice
from sbxkit._grammar.flags import parse_with_flags_after_image
from sbxkit._grammar.run_grammar import add_run_parser
from sbxkit.cli.admin import add_admin_parsers
from sbxkit.cli.batch import add_batch_parser
from sbxkit.cli.cluster import add_cluster_parser
from sbxkit.cli.mcp import add_mcp_parser
from sbxkit.cli.sessions import add_session_parsers
from sbxkit.cli.shell import add_shell_parser
from sbxkit.cli.top import add_top_parser


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("sbxkit")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sbxkit", description="Run untrusted commands in hardened Docker sandboxes."
    )
    parser.add_argument("--version", action="version", version=f"sbxkit {version()}")
    # Subcommands are Parsers too (argparse uses the parent's class), typed as the base class.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="action", required=True),
    )
    add_run_parser(sub)
    add_admin_parsers(sub)
    add_batch_parser(sub)
    add_shell_parser(sub)
    add_session_parsers(sub)
    add_cluster_parser(sub)
    add_mcp_parser(sub)
    add_top_parser(sub)
    return parser


def refuse_closed_stdout() -> None:
    """A closed stdout (``sbxkit run ... >&-``) makes Python's ``sys.stdout`` None: refuse
    before anything runs (exit 2) instead of failing on the first write after the payload
    ran. A closed stderr leaves only the exit status to say so."""
    if sys.stdout is None:
        if sys.stderr is not None:
            print(
                "sbxkit: error: stdout: is closed; sbxkit writes results there (redirect it "
                "to /dev/null to discard them)",
                file=sys.stderr,
            )
        sys.exit(EXIT_REFUSED)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    refuse_closed_stdout()
    argv = list(sys.argv[1:] if argv is None else argv)
    options = argv[: argv.index("--")] if "--" in argv else argv
    Parser.json_errors = "--json" in options
    parser = build_parser()
    if not argv:  # what there is to do, rather than argparse's "arguments are required"
        parser.print_help(sys.stderr)
        sys.exit(EXIT_REFUSED)
    args, unknown = parse_with_flags_after_image(parser, argv)
    if unknown:  # a typo in a subcommand's flag: that subcommand's usage, not the top level's
        chosen = subcommand_parser(parser, args.action)
        chosen.error(advice(chosen, unknown))
    exit_with(args.handler, args)
