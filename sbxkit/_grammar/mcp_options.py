"""The profile's ``[mcp]`` table and ``sbxkit mcp --http``'s address (pure).

::

    [mcp]
    images = ["sbxkit-test/python:latest", "sbxkit-test/busybox:latest"]   # the allow-list
    max_sandboxes_per_client = 4  # open sandboxes and runs under way, per client
    max_sandboxes = 16            # the same, all clients together
    lifetime = 3600               # the longest an open sandbox may live (s)
    idle_timeout = 600            # an open sandbox no call used for this long is removed (s)
    max_file_bytes = "4m"         # one stdin, one file read or written, a run's files together
    max_processes = 4             # background processes running at once in one open sandbox
    max_read_wait = 30            # the longest a process_read may wait for output (s)

What a model may ask for beyond this — limits — is capped by ``[sandbox.docker.limits]``: a
tool call may lower them, never raise them (``sbxkit.mcp.policy``). Every value here is
checked when the profile is decoded; errors name their path (``mcp.max_sandboxes``), unknown
keys are refused by path like everywhere else in a profile.
"""

from __future__ import annotations

import ipaddress

import msgspec

from sbxkit._model.spec import MAX_TIMEOUT_S, parse_size, validate_image
from sbxkit.errors import SpecError

ROOT = "mcp"
MAX_SANDBOXES = 4096
"""A ceiling on the ceilings: each open sandbox holds a supervisor lease and a task."""
MAX_FILE_BYTES = 64 * 1024 * 1024
"""Transfers travel inside JSON messages (base64 or text): 64 MiB is already a lot."""
MIN_IDLE_TIMEOUT_S = 1.0
MAX_PROCESSES = 64
"""A ceiling on ``max_processes``: each process holds an exec stream, a task and its output."""
MAX_READ_WAIT_S = 600.0
"""A ceiling on ``max_read_wait``: a waiting read holds its HTTP request open."""


class McpOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[mcp]``: what an MCP server built from this profile lets models have."""

    images: list[str] = msgspec.field(default_factory=list)
    """The images a tool call may name. Empty: only ``sandbox.docker.image``."""
    max_sandboxes_per_client: int = 4
    max_sandboxes: int = 16
    lifetime: float = 3600.0
    idle_timeout: float = 600.0
    max_file_bytes: int | str = "4m"
    max_processes: int = 4
    """Background processes (``process_start``) running at once in one open sandbox."""
    max_read_wait: float = 30.0
    """The longest one ``process_read`` may wait for new output, in seconds."""


def _positive_count(value: int, field: str, most: int = MAX_SANDBOXES) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(field, "must be a whole number >= 1")
    if value > most:
        raise SpecError(field, f"must be <= {most}")


def _seconds(value: float, field: str, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, "must be a number of seconds")
    if not minimum <= value <= MAX_TIMEOUT_S:
        raise SpecError(field, f"must be in {minimum:g}..{MAX_TIMEOUT_S:.0f} seconds")


def file_bytes(options: McpOptions) -> int:
    """``max_file_bytes`` in bytes (a size string parsed as everywhere: ``"4m"`` is 4 MiB)."""
    field = f"{ROOT}.max_file_bytes"
    raw = options.max_file_bytes
    value = parse_size(raw, field) if isinstance(raw, str) else raw
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(field, "must be a size >= 1 byte")
    if value > MAX_FILE_BYTES:
        raise SpecError(field, f"must be at most {MAX_FILE_BYTES} bytes (64 MiB)")
    return value


JSON_ESCAPE_FACTOR = 6
"""The most bytes JSON spends on one byte of text (``\\u001f``); base64 spends 4/3."""
PAYLOADS_PER_CALL = 2
"""A ``run`` carries the most: its stdin and its files, each up to ``max_file_bytes``."""
REQUEST_SLACK = 1024 * 1024
"""Room for everything else in a request: the command, names, variables, the envelope."""


def request_body_limit(file_bytes: int) -> int:
    """The largest HTTP request body the server reads: whatever a call within ``file_bytes``
    carries, however its client escapes it, so that a call past ``max_file_bytes`` reaches
    the tool — which refuses it naming the option — instead of failing as a protocol error."""
    return PAYLOADS_PER_CALL * JSON_ESCAPE_FACTOR * file_bytes + REQUEST_SLACK


def validate_mcp_options(options: McpOptions) -> None:
    """Every value of ``[mcp]`` on its own; how it fits the rest of the profile (an image to
    default to, the mandatory limits) is ``sbxkit.mcp.policy``'s, when a server starts."""
    seen: set[str] = set()
    for index, image in enumerate(options.images):
        validate_image(image, f"{ROOT}.images[{index}]")
        if image in seen:
            raise SpecError(f"{ROOT}.images[{index}]", f"{image!r} is listed twice")
        seen.add(image)
    _positive_count(options.max_sandboxes_per_client, f"{ROOT}.max_sandboxes_per_client")
    _positive_count(options.max_sandboxes, f"{ROOT}.max_sandboxes")
    if options.max_sandboxes_per_client > options.max_sandboxes:
        raise SpecError(
            f"{ROOT}.max_sandboxes_per_client",
            f"must be <= {ROOT}.max_sandboxes ({options.max_sandboxes})",
        )
    _seconds(options.lifetime, f"{ROOT}.lifetime", MIN_IDLE_TIMEOUT_S)
    _seconds(options.idle_timeout, f"{ROOT}.idle_timeout", MIN_IDLE_TIMEOUT_S)
    file_bytes(options)
    _positive_count(options.max_processes, f"{ROOT}.max_processes", MAX_PROCESSES)
    wait = options.max_read_wait
    if isinstance(wait, bool) or not isinstance(wait, int | float):
        raise SpecError(f"{ROOT}.max_read_wait", "must be a number of seconds")
    if not 0 <= wait <= MAX_READ_WAIT_S:
        raise SpecError(f"{ROOT}.max_read_wait", f"must be in 0..{MAX_READ_WAIT_S:.0f} seconds")


def parse_http_address(text: str, field: str = "--http") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) with a loopback IP literal for HOST: the server
    hands out sandboxes to whoever connects, so it never listens beyond this machine. A name
    (``localhost``) is refused too: what it resolves to is not ours to decide. Port 0 picks a
    free port (the server prints the one it got)."""
    host, colon, port_text = text.rpartition(":")
    if not colon or not host:
        raise SpecError(field, f"expected HOST:PORT, e.g. 127.0.0.1:8765 (got {text!r})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise SpecError(
            field,
            f"{host!r} is not an IP address; sbxkit mcp listens on a loopback address only: "
            "127.0.0.1 or [::1]",
        ) from None
    if not address.is_loopback:
        raise SpecError(
            field,
            f"{host} is not a loopback address; sbxkit mcp listens on loopback only "
            "(127.0.0.1 or [::1]): anyone who reaches it can run code in sandboxes",
        )
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise SpecError(field, f"port must be a number in 0..65535 (got {port_text!r})")
    return str(address), int(port_text)
