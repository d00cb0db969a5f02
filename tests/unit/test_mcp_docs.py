"""docs/mcp.md's configuration blocks say what is true: the JSON an MCP client reads launches
``sbxkit mcp`` with arguments sbxkit's own parser accepts, and the profile is one a server
starts from. (tests/unit/test_doc_blocks.py parses every data block and the engine tier runs
the Python example; this checks what those blocks mean for sbxkit mcp.)"""

from __future__ import annotations

import json
from typing import Any

from sbxkit._grammar.profile import decode_profile
from sbxkit.cli.parser import build_parser
from sbxkit.mcp.policy import policy_from_profile
from sbxkit.mcp.tokens import Credentials, parse_tokens
from tests.doc_blocks import ROOT, Block, extract

SOURCE = "docs/mcp.md"


def blocks(lang: str) -> list[Block]:
    return [b for b in extract((ROOT / SOURCE).read_text(), SOURCE) if b.lang == lang]


def servers() -> list[dict[str, Any]]:
    return [json.loads(block.code)["mcpServers"]["sbxkit"] for block in blocks("json")]


def test_the_stdio_config_launches_sbxkit_mcp() -> None:
    [entry] = [server for server in servers() if "command" in server]
    assert entry["command"] == "sbxkit"
    args = build_parser().parse_args(entry["args"])
    assert (args.action, args.http) == ("mcp", None)
    assert args.profile.endswith("mcp-profile.toml")
    assert all(isinstance(value, str) for value in entry.get("env", {}).values())


def test_the_http_config_names_a_loopback_url_and_sends_the_token() -> None:
    [entry] = [server for server in servers() if "url" in server]
    assert entry["url"] == "http://127.0.0.1:8765/mcp"
    scheme, _, token = entry["headers"]["Authorization"].partition(" ")
    assert (scheme, token.startswith("${")) == ("Bearer", True)


def test_the_documented_token_file_is_one_a_server_accepts() -> None:
    [example] = [block for block in blocks("text") if "--token-file" in block.code]
    credentials = Credentials(parse_tokens(example.code, "docs/mcp.md"))
    assert credentials.names == ("desktop", "ci")
    [command] = [line for line in example.code.splitlines() if line.startswith("# sbxkit mcp")]
    args = build_parser().parse_args(command.split()[2:])
    assert (args.http, args.token_file) == ("127.0.0.1:8765", "~/.config/sbxkit/mcp.tokens")


def test_the_documented_profile_starts_a_server() -> None:
    [profile] = blocks("toml")
    assert profile.skip is None
    policy = policy_from_profile(decode_profile(profile.code))
    assert policy.images == ("sbxkit-test/python:latest", "sbxkit-test/busybox:latest")
    assert policy.options.max_sandboxes_per_client == 4
    assert policy.file_bytes == 1024 * 1024


def test_only_the_server_commands_are_skipped() -> None:
    skipped = [block.lang for block in extract((ROOT / SOURCE).read_text(), SOURCE) if block.skip]
    assert skipped == ["sh"]
    assert [block.skip for block in blocks("python")] == [None, None, None]  # run as written
