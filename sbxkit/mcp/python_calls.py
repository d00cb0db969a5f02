"""The ``python`` tool (pure): its request within the operator's policy, its schema, and how a
``CodeResult`` becomes MCP content — text for stdout, stderr and the value, an image for each
PNG — and JSON.

One interpreter per MCP session (``sbxkit.mcp.hub``) runs in a sandbox of the profile's default
image and limits, like a ``sandbox_open`` without arguments: a call's ``timeout`` lowers the
profile's ``limits.timeout``, its output is capped at ``limits.max_output`` per stream, and its
code at ``mcp.max_file_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from sbxkit._consumers.interp_frames import CodeResult
from sbxkit._model.network_ports import PortForward, port_text
from sbxkit._model.spec import Limits, check_limit
from sbxkit.errors import InterpreterDied
from sbxkit.mcp.arguments import PythonArgs, text_bytes
from sbxkit.mcp.policy import McpPolicy, at_most
from sbxkit.mcp.schema_parts import NUMBER, PORTS, STRING, TOOL_ERROR, hints, obj
from sbxkit.mcp.shapes import port_fields

IMAGE_TYPES = ("image/png",)
"""Representations sent as MCP image content (base64), not as JSON."""


class PythonRequest(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    timeout_s: float
    max_output: int
    restart: bool


def python_request(policy: McpPolicy, command_limits: Limits, args: PythonArgs) -> PythonRequest:
    """A call's code (at most ``mcp.max_file_bytes``) and time limit (at most the profile's
    ``limits.timeout``, also the default)."""
    text_bytes(args.code, "code", policy.file_bytes)
    timeout = command_limits.timeout_s
    if args.timeout is not None:
        check_limit("timeout_s", args.timeout, "timeout")
        at_most("timeout", "timeout_s", args.timeout, timeout)
        timeout = args.timeout
    assert command_limits.output_bytes is not None  # mandatory in an MCP policy
    return PythonRequest(
        code=args.code,
        timeout_s=float(timeout),
        max_output=command_limits.output_bytes,
        restart=args.restart,
    )


@dataclass(frozen=True)
class PythonAnswer:
    """What the hub answers a ``python`` call."""

    result: CodeResult
    fresh: bool
    """This call started the interpreter: nothing from earlier calls is defined."""
    timeout_s: float
    ports: tuple[PortForward, ...] = ()
    """The interpreter's sandbox's inbound ports as the host reaches them."""


def restart_hint(died: InterpreterDied) -> InterpreterDied:
    """The same death, telling the model how to go on."""
    return InterpreterDied(
        f"{died.reason}. Call python with restart: true for a fresh one",
        status=died.status,
        exit_code=died.exit_code,
        evidence=died.evidence,
    )


Part = tuple[Literal["text"], str] | tuple[Literal["image"], str, str]
"""One content block: ``("text", text)`` or ``("image", base64, mime type)``."""


def python_fields(
    result: CodeResult, *, fresh: bool, ports: tuple[PortForward, ...] = ()
) -> dict[str, Any]:
    """The call as JSON: sbxkit's status, the output, the value's text and representations
    (images go as image content only), the code's error, whether this call started a new
    interpreter (``fresh``: nothing from earlier calls is defined), and the interpreter's
    forwarded ports (a server its code starts on one is reached there from the host)."""
    error = result.error
    return {
        "status": result.status,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "text": result.text,
        "data": {mime: value for mime, value in result.data.items() if mime not in IMAGE_TYPES},
        "images": [mime for mime, _ in _images(result)],
        "error": None
        if error is None
        else {"name": error.name, "value": error.value, "traceback": error.traceback},
        "duration_s": round(result.run_s, 3),
        "fresh": fresh,
        "ports": port_fields(ports),
    }


def python_parts(
    result: CodeResult, *, timeout_s: float, ports: tuple[PortForward, ...] = ()
) -> list[Part]:
    """What a model reads: stdout, stderr (labelled), the value's text, what sbxkit did to the
    call (a timeout, an overflow), the error's traceback, each image, and the forwarded ports
    (when the profile has any)."""
    parts: list[Part] = []
    if result.stdout:
        parts.append(("text", result.stdout))
    if result.stderr:
        parts.append(("text", "stderr:\n" + result.stderr))
    if result.text is not None:
        parts.append(("text", result.text))
    if result.status == "timed_out":
        parts.append(("text", f"timed out: interrupted after {timeout_s:g} s (state kept)"))
    elif result.status == "output_exceeded":
        parts.append(("text", "output_exceeded: interrupted at max_output (state kept)"))
    error = result.error
    if error is not None:
        parts.append(("text", error.traceback or f"{error.name}: {error.value}"))
    parts += [("image", image, mime) for mime, image in _images(result)]
    if ports:
        shown = ", ".join(port_text(port) for port in ports)
        parts.append(("text", f"forwarded ports (host->sandbox 127.0.0.1): {shown}"))
    return parts


def _images(result: CodeResult) -> list[tuple[str, str]]:
    """Each image of the call, in order: the figures it left open (``displays``), then the
    value's own."""
    shown = [*result.displays, result.data]
    return [(mime, each[mime]) for each in shown for mime in IMAGE_TYPES if each.get(mime)]


CODE_ERROR = {
    "type": "object",
    "description": "What the code raised (isError is true): its class name, str and traceback.",
    "properties": {"name": STRING, "value": STRING, "traceback": STRING},
    "required": ["name", "value", "traceback"],
}

PYTHON_RESULT_FIELDS = ["status", "stdout", "stderr", "text", "data", "images", "error"]


def python_tool_definition(policy: McpPolicy) -> dict[str, Any]:
    """The tool as a model sees it; its output schema admits a result (the code's error
    included) or a tool error, so ``schemas.admitting_errors`` leaves it as it is."""
    limits = policy.ceilings
    options = policy.options
    return {
        "name": "python",
        "description": "Run Python code in an interpreter that keeps its state (variables, "
        "imports, files in /tmp) between calls of this session, like a notebook: the value of "
        "a last expression comes back as text, and a PNG (a matplotlib figure, an object with "
        "_repr_png_) as an image. It runs in a sandbox of the image "
        f"{policy.base.image}, created on the first call and removed when this session ends or "
        f"after {options.idle_timeout:g} s without a call (it counts as one of this client's "
        "sandboxes). A call past its timeout or max_output is interrupted "
        "(KeyboardInterrupt) and the state is kept; an exception is an error result with its "
        "traceback. If the interpreter died (os._exit, out of memory), call again with "
        "restart: true for a fresh one (state gone). Output is streamed as progress "
        "notifications when you send a progressToken.",
        "inputSchema": obj(
            {
                "code": {"type": "string", "description": "Python source to run."},
                "timeout": {
                    "type": "number",
                    "maximum": limits.timeout_s,
                    "description": "Seconds this call may run before it is interrupted; at "
                    f"most and by default {limits.timeout_s:g}.",
                },
                "restart": {
                    "type": "boolean",
                    "description": "Start a fresh interpreter (a new sandbox) first: every "
                    "variable and file of the old one is gone. Default false.",
                },
            },
            ["code"],
        ),
        "outputSchema": {
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "enum": ["ok", "error", "timed_out", "output_exceeded"],
                },
                "stdout": STRING,
                "stderr": STRING,
                "text": {"type": ["string", "null"]},
                "data": {"type": "object", "additionalProperties": STRING},
                "images": {"type": "array", "items": STRING},
                "error": {"anyOf": [{"type": "null"}, CODE_ERROR, TOOL_ERROR]},
                "duration_s": NUMBER,
                "fresh": {"type": "boolean"},
                "ports": PORTS,
            },
            "anyOf": [
                {
                    "required": PYTHON_RESULT_FIELDS,
                    "properties": {"error": {"anyOf": [{"type": "null"}, CODE_ERROR]}},
                },
                {"required": ["error"], "maxProperties": 1, "properties": {"error": TOOL_ERROR}},
            ],
        },
    }


def python_annotations(reaches_out: bool) -> dict[str, dict[str, Any]]:
    """It runs code like ``sandbox_exec`` runs a command."""
    return {
        "python": hints("Run Python in a stateful interpreter", False, True, False, reaches_out)
    }
