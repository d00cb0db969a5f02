"""The process tools as a model sees them (pure): background processes in an open sandbox —
a shell an agent keeps across calls, fed by ``process_write``, read by cursor with
``process_read`` (``sbxkit.mcp.process_calls`` holds their bounds)."""

from __future__ import annotations

from typing import Any

from sbxkit.mcp.policy import McpPolicy
from sbxkit.mcp.schema_parts import (
    COMMAND,
    ENCODING,
    INTEGER,
    NULLABLE_STRING,
    NUMBER,
    SANDBOX_ID,
    SIZE,
    STRING,
    env_schema,
    hints,
    obj,
)

PROCESS_ID = {"type": "string", "description": "The id process_start returned (p…)."}

EXIT = {
    "type": ["object", "null"],
    "description": "How the process ended, or null while it runs. status: exited (exit_code "
    "is its own), timed_out, output_exceeded, killed (process_kill, a signal it died of, or "
    "its sandbox's end: evidence.kill says which) or oom_killed (evidence.oom says what "
    "decided).",
    "properties": {
        "status": {
            "type": "string",
            "enum": ["exited", "timed_out", "output_exceeded", "oom_killed", "killed"],
        },
        "exit_code": {"type": ["integer", "null"]},
        "output_bytes": INTEGER,
        "duration_s": NUMBER,
        "evidence": {
            "type": "object",
            "properties": {"oom": NULLABLE_STRING, "kill": NULLABLE_STRING},
            "required": ["oom", "kill"],
        },
    },
    "required": ["status", "exit_code", "output_bytes", "duration_s", "evidence"],
}

PROCESS = {
    "type": "object",
    "properties": {
        "sandbox_id": STRING,
        "process_id": STRING,
        "command": {"type": "array", "items": STRING},
        "pty": {"type": "boolean"},
        "running": {"type": "boolean"},
        "output_bytes": INTEGER,
        "exit": EXIT,
    },
    "required": ["sandbox_id", "process_id", "command", "pty", "running", "output_bytes", "exit"],
}

WRITTEN = {
    "type": "object",
    "properties": {
        "sandbox_id": STRING,
        "process_id": STRING,
        "bytes": INTEGER,
        "stdin_closed": {"type": "boolean"},
    },
    "required": ["sandbox_id", "process_id", "bytes", "stdin_closed"],
}

READ = {
    "type": "object",
    "properties": {
        "sandbox_id": STRING,
        "process_id": STRING,
        "output": STRING,
        "encoding": STRING,
        "cursor": INTEGER,
        "next_cursor": INTEGER,
        "bytes": INTEGER,
        "done": {"type": "boolean"},
        "running": {"type": "boolean"},
        "exit": EXIT,
    },
    "required": [
        "sandbox_id",
        "process_id",
        "output",
        "encoding",
        "cursor",
        "next_cursor",
        "bytes",
        "done",
        "running",
        "exit",
    ],
}

LISTED = {
    "type": "object",
    "properties": {
        "sandbox_id": STRING,
        "processes": {"type": "array", "items": PROCESS},
        "running": INTEGER,
        "max_processes": INTEGER,
    },
    "required": ["sandbox_id", "processes", "running", "max_processes"],
}


def process_annotations(reaches_out: bool) -> dict[str, dict[str, Any]]:
    """A process runs a command like ``sandbox_exec``; reading its output changes nothing."""
    return {
        "process_start": hints("Start a background process", False, True, False, reaches_out),
        "process_write": hints("Write to a process's stdin", False, True, False, reaches_out),
        "process_read": hints("Read a process's output", True, False, True, False),
        "process_signal": hints("Signal a process", False, True, False, False),
        "process_kill": hints("Kill a process", False, True, True, False),
        "process_list": hints("List a sandbox's processes", True, False, True, False),
    }


def process_tool_definitions(policy: McpPolicy) -> list[dict[str, Any]]:
    """The six process tools: name, description, inputSchema, outputSchema."""
    options = policy.options
    size = f"{policy.file_bytes} bytes"
    ids = {"sandbox_id": SANDBOX_ID, "process_id": PROCESS_ID}
    return [
        {
            "name": "process_start",
            "description": "Start a background process in an open sandbox and return at once "
            "with its process_id: a shell or server that keeps running between calls. Feed it "
            "with process_write, read its output (stdout and stderr merged) with process_read. "
            "It runs until it exits, its timeout (default: until the sandbox ends), its output "
            "passes max_output (output_exceeded), process_kill, or the sandbox's end. At most "
            f"{options.max_processes} run at once in one sandbox.",
            "inputSchema": obj(
                {
                    "sandbox_id": SANDBOX_ID,
                    "command": {
                        **COMMAND,
                        "description": "The program and its arguments, run without a shell: "
                        '["python3", "-i"]. Give command or shell, not both.',
                    },
                    "shell": {
                        "type": "string",
                        "description": 'A command line run by sh -c, e.g. "cd src && make '
                        'watch" or "sh -i" for an interactive shell. Give command or shell.',
                    },
                    "pty": {
                        "type": "boolean",
                        "description": "Run it on a terminal (default false): for programs "
                        "that behave differently on one; output then carries terminal "
                        "sequences and echoes input.",
                    },
                    "timeout": {
                        "type": "number",
                        "description": "Seconds it may run; at most and by default the "
                        "sandbox's remaining lifetime.",
                    },
                    "max_output": {
                        **SIZE,
                        "description": "Bytes of output (stdout and stderr together) it may "
                        "write in all; at most and by default the sandbox's limits.max_output. "
                        "One byte more kills it (output_exceeded).",
                    },
                    "cwd": {
                        "type": "string",
                        "description": "Absolute directory it starts in (default "
                        f"{policy.base.workdir}).",
                    },
                    "env": env_schema("this process"),
                },
                ["sandbox_id"],
            ),
            "outputSchema": PROCESS,
        },
        {
            "name": "process_write",
            "description": "Write to a background process's standard input (a shell: a "
            "command line ending in a newline). close_stdin sends end-of-file after the data. "
            f"At most {size} per call.",
            "inputSchema": obj(
                {
                    **ids,
                    "data": {
                        "type": "string",
                        "description": 'What to write, e.g. "ls -l\\n" (default empty, to only '
                        "close stdin).",
                    },
                    "encoding": ENCODING,
                    "close_stdin": {
                        "type": "boolean",
                        "description": "Close its stdin after writing (default false).",
                    },
                },
                ["sandbox_id", "process_id"],
            ),
            "outputSchema": WRITTEN,
        },
        {
            "name": "process_read",
            "description": "Read a background process's output from a byte cursor (0 is the "
            "start; pass the returned next_cursor to get only what is new). With wait, waits "
            f"up to that many seconds (at most {options.max_read_wait:g}) for new output or "
            "its end. done is true once it ended and everything has been read; exit says how "
            "it ended. Output is kept whole, so any cursor can be read again.",
            "inputSchema": obj(
                {
                    **ids,
                    "cursor": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Byte offset to read from (default 0).",
                    },
                    "max_bytes": {
                        **SIZE,
                        "description": f"At most this many bytes (default 64 KiB, at most {size}).",
                    },
                    "wait": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": options.max_read_wait,
                        "description": "Seconds to wait when nothing is new yet (default 0).",
                    },
                    "encoding": ENCODING,
                },
                ["sandbox_id", "process_id"],
            ),
            "outputSchema": READ,
        },
        {
            "name": "process_signal",
            "description": "Send a signal to a background process and everything it started "
            '(its process group): "INT" as Ctrl-C would, "TERM" to ask it to end.',
            "inputSchema": obj(
                {
                    **ids,
                    "signal": {
                        "type": ["string", "integer"],
                        "description": 'A signal name ("INT", "TERM", "HUP") or number.',
                    },
                },
                ["sandbox_id", "process_id", "signal"],
            ),
            "outputSchema": PROCESS,
        },
        {
            "name": "process_kill",
            "description": "Kill a background process and everything it started, and return "
            "how it ended (killed, unless it had ended already).",
            "inputSchema": obj(ids, ["sandbox_id", "process_id"]),
            "outputSchema": PROCESS,
        },
        {
            "name": "process_list",
            "description": "List a sandbox's background processes: those running, and those "
            "that ended recently with how they ended.",
            "inputSchema": obj({"sandbox_id": SANDBOX_ID}, ["sandbox_id"]),
            "outputSchema": LISTED,
        },
    ]
