"""The pieces every tool's JSON schema is built from (pure): types, the ids, a command, an
encoding, environment variables, and the error every output schema admits."""

from __future__ import annotations

from typing import Any

STRING = {"type": "string"}
NULLABLE_STRING = {"type": ["string", "null"]}
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}
SIZE = {"type": ["integer", "string"]}

TOOL_ERROR = {
    "type": "object",
    "description": "Only on an error result (isError: true): why the call was refused or "
    "failed. Nothing was created.",
    "properties": {
        "type": {"type": "string", "description": "the error's kind, e.g. SpecError"},
        "field": {
            "type": ["string", "null"],
            "description": "the argument (or profile option) at fault",
        },
        "rule": {"type": ["string", "null"], "description": "the rule it broke"},
        "message": {"type": "string", "description": "field and rule in one sentence"},
    },
    "required": ["type", "field", "rule", "message"],
}


PORTS = {
    "type": "array",
    "description": "The sandbox's inbound ports (the operator's network.ports): each "
    "connection to address:host_port on the host reaches the sandbox's own "
    "127.0.0.1:sandbox_port. A server inside must listen on 127.0.0.1 there. Empty when the "
    "profile forwards none.",
    "items": {
        "type": "object",
        "properties": {
            "address": {"type": "string"},
            "host_port": {"type": "integer"},
            "sandbox_port": {"type": "integer"},
        },
        "required": ["address", "host_port", "sandbox_port"],
    },
}


SANDBOX_ID = {
    "type": "string",
    "description": "The id sandbox_open returned (sbx-…).",
}


def obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def env_schema(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": STRING,
        "description": f"Environment variables for {what} (NAME: value). Variables the "
        "operator sets cannot be changed.",
    }


COMMAND = {
    "type": "array",
    "items": STRING,
    "minItems": 1,
    "description": 'The program and its arguments, run without a shell: ["python3", "main.py"]. '
    'For pipes, redirections or &&, use ["sh", "-c", "..."].',
}
STDIN = {
    "type": "string",
    "description": "Text fed to the command's standard input, then closed (default: empty).",
}
ENCODING = {
    "type": "string",
    "enum": ["utf-8", "base64"],
    "description": "utf-8 (default) for text; base64 for bytes that are not text.",
}


def hints(
    title: str, read_only: bool, destructive: bool, idempotent: bool, world: bool
) -> dict[str, Any]:
    """A tool's MCP annotations."""
    return {
        "title": title,
        "readOnlyHint": read_only,
        "destructiveHint": destructive,
        "idempotentHint": idempotent,
        "openWorldHint": world,
    }
