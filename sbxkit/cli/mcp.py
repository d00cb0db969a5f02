"""``sbxkit mcp --profile FILE [--http 127.0.0.1:PORT]``: hardened sandboxes as MCP tools.

The server lives in ``sbxkit.mcp`` and needs the official MCP SDK (the ``sbxkit[mcp]``
extra); it is imported only when this subcommand runs, and its absence is said plainly.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from sbxkit._grammar.mcp_options import parse_http_address
from sbxkit._grammar.profile import load_profile
from sbxkit._grammar.profile_files import check_host_files
from sbxkit._plan.plan import check_spec
from sbxkit.errors import MissingExtra, SpecError
from sbxkit.mcp.policy import policy_from_profile
from sbxkit.mcp.token_files import read_token_file

SDK_MODULES = {"mcp", "mcp_types", "uvicorn", "starlette", "anyio", "pydantic"}
INSTALL_HINT = "pip install '.[mcp]' in the sbxkit clone (sbxkit is not on PyPI)"


def cmd_mcp(args: argparse.Namespace) -> int:
    address = parse_http_address(args.http) if args.http is not None else None
    if args.token_file is not None and address is None:
        raise SpecError("--token-file", "authenticates HTTP clients: use it with --http")
    credentials = read_token_file(args.token_file) if args.token_file is not None else None
    profile = load_profile(args.profile)
    policy = policy_from_profile(profile)
    check_host_files(profile)  # every call would fail on a missing one: refuse it now
    # The profile's sandbox as this environment will judge every call's (SBXKIT_ENV, the
    # supervisor's state dir): refused now rather than on every call.
    check_spec(policy.base, policy.settings)
    try:
        from sbxkit.mcp import transports
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SDK_MODULES:
            raise
        raise MissingExtra(
            "sbxkit mcp", f"needs the MCP SDK, which is not installed ({exc.name}): {INSTALL_HINT}"
        ) from None
    logging.basicConfig(level=logging.WARNING, format="sbxkit mcp: %(name)s: %(message)s")
    if address is None:
        return transports.serve_stdio(policy, args.socket)
    return transports.serve_http(policy, *address, args.socket, credentials)


def add_mcp_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "mcp",
        help="serve hardened sandboxes as MCP tools (stdio, or HTTP on loopback)",
        description="An MCP server whose tools run commands in hardened, supervised "
        "sandboxes; the profile decides what a model may ask for (docs/mcp.md). Needs "
        f"the mcp extra: {INSTALL_HINT}.",
    )
    parser.add_argument(
        "--profile",
        required=True,
        metavar="FILE",
        help="TOML profile: [sandbox.docker] (image, limits as ceilings, mounts, network) "
        "and [mcp] (allowed images, quotas, lifetimes)",
    )
    parser.add_argument(
        "--http",
        metavar="127.0.0.1:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio; HOST must be "
        "a loopback address (127.0.0.1 or [::1]); PORT 0 picks a free one. Every request "
        "needs Authorization: Bearer TOKEN: without --token-file the server generates a token "
        "and prints the path of the file (0600) that holds it",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="with --http: the bearer tokens clients must present, one per line, TOKEN or "
        "NAME TOKEN (each named client has its own quota); the file must be this account's "
        "and closed to group and others (chmod 600)",
    )
    parser.add_argument("--socket", help="Docker socket path (default: discovered)")
    parser.set_defaults(handler=cmd_mcp)
    return parser
