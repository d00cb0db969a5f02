"""The tools a model sees: names, titles, descriptions, annotations, input and output JSON
schemas (pure).

Descriptions are built from the operator's policy, so they state what this server really
gives: the network, the writable places, the mounts, each limit's ceiling, the images, the
quotas and lifetimes. The input schemas list exactly the fields ``sbxkit.mcp.arguments``
accepts (tests/unit/test_mcp_policy.py checks they agree); nothing else reaches a sandbox.

Each output schema admits the tool's result and its error (``{"error": {type, field, rule,
message}}``, sent with ``isError``): the protocol asks structured content to conform to the
tool's output schema, and a client that validates error results too (the MCP Inspector does)
must not refuse the error it is meant to show. The annotations are computed from the policy
too: whether a command can change anything that outlives its sandbox (a writable bind mount
or volume) or reach beyond this machine (a network other than ``none``).
"""

from __future__ import annotations

from typing import Any, get_args

from sbxkit._grammar.profile import LIMIT_FIELDS
from sbxkit._model.mounts import Mount, TmpfsMount
from sbxkit._model.network_terms import Network
from sbxkit._model.result import Status
from sbxkit._model.spec import Limits
from sbxkit.mcp.arguments import ARGS, FILES_ROOT
from sbxkit.mcp.policy import McpPolicy, show
from sbxkit.mcp.process_schemas import process_annotations, process_tool_definitions
from sbxkit.mcp.python_calls import python_annotations, python_tool_definition
from sbxkit.mcp.schema_parts import (
    COMMAND,
    ENCODING,
    INTEGER,
    NULLABLE_STRING,
    NUMBER,
    PORTS,
    SANDBOX_ID,
    SIZE,
    STDIN,
    STRING,
    TOOL_ERROR,
    env_schema,
    hints,
    obj,
)
from sbxkit.mcp.shapes import COMMAND_FIELDS

_LIMIT_MEANINGS = {
    "cpus": "CPU cores (fractions allowed)",
    "memory": "memory for everything in the sandbox, files in /tmp and /dev/shm included; a "
    'size such as "256m" or a byte count',
    "pids": "processes and threads at once",
    "max_output": "bytes kept of stdout and of stderr each; one byte more ends the command as "
    "output_exceeded; a size or a byte count",
    "timeout": "seconds one command may run before it is killed (status timed_out)",
    "fsize": "the largest file a process may write; a size or a byte count",
    "scratch": f"the size of {FILES_ROOT}; a size or a byte count",
    "shm": "the size of /dev/shm; a size or a byte count",
}

EVIDENCE = {
    "type": "object",
    "description": "What decided an oom_killed or killed status (the daemon's OOMKilled flag "
    "or oom event; its record of a kill sbxkit did not send). timed_out and output_exceeded "
    "are the sandbox's own limits and need none. An exit status of 137 alone proves nothing.",
    "properties": {
        "oom": NULLABLE_STRING,
        "kill": NULLABLE_STRING,
        "witness": {
            "type": "string",
            "enum": ["kernel", "daemon"],
            "description": "who witnessed the exit: the kernel (the sandbox init's pidfd, read "
            "on the host) or the daemon (its wait and records); never the payload",
        },
    },
    "required": ["oom", "kill", "witness"],
}

COMMAND_RESULT = {
    "type": "object",
    "properties": {
        "status": {
            "type": "string",
            "enum": list(get_args(Status)),
        },
        "exit_code": {"type": ["integer", "null"]},
        "stdout": STRING,
        "stderr": STRING,
        "stdout_bytes": INTEGER,
        "stderr_bytes": INTEGER,
        "overflowed": {"type": ["string", "null"], "enum": ["stdout", "stderr", None]},
        "evidence": EVIDENCE,
        "duration_s": NUMBER,
        "denials": {
            "type": "array",
            "description": "what the governed network refused during the command: each "
            "destination the sandbox asked for and the rule that refused it",
            "items": {
                "type": "object",
                "properties": {"destination": STRING, "reason": STRING, "kind": STRING},
                "required": ["destination", "reason", "kind"],
            },
        },
    },
    "required": [*COMMAND_FIELDS, "evidence", "duration_s", "denials"],
}

SANDBOX = {
    "type": "object",
    "properties": {
        "sandbox_id": STRING,
        "image": STRING,
        "workdir": STRING,
        "files_root": STRING,
        "limits": {"type": "object"},
        "lifetime_s": NUMBER,
        "expires_in_s": NUMBER,
        "idle_timeout_s": NUMBER,
        "idle_s": NUMBER,
        "busy": {"type": "boolean"},
        "ports": PORTS,
    },
    "required": [
        "sandbox_id",
        "image",
        "workdir",
        "files_root",
        "limits",
        "expires_in_s",
        "ports",
    ],
}

SANDBOX_LIST = {
    "type": "object",
    "properties": {
        "sandboxes": {"type": "array", "items": SANDBOX},
        "open_or_running": INTEGER,
        "max_per_client": INTEGER,
        "open_or_running_in_all": INTEGER,
        "max_in_all": INTEGER,
    },
    "required": ["sandboxes", "open_or_running", "max_per_client"],
}

FILE_WRITTEN = {
    "type": "object",
    "properties": {"sandbox_id": STRING, "path": STRING, "bytes": INTEGER},
    "required": ["sandbox_id", "path", "bytes"],
}

FILE_READ = {
    "type": "object",
    "properties": {
        "sandbox_id": STRING,
        "path": STRING,
        "content": STRING,
        "encoding": STRING,
        "bytes": INTEGER,
    },
    "required": ["sandbox_id", "path", "content", "encoding", "bytes"],
}

CLOSED = {
    "type": "object",
    "properties": {"sandbox_id": STRING, "closed": {"type": "boolean"}},
    "required": ["sandbox_id", "closed"],
}


def admitting_errors(result: dict[str, Any]) -> dict[str, Any]:
    """A tool's output schema: its result, or (on an error result) ``{"error": …}``. The
    properties stay at the top, as every protocol version reads them; which fields are
    required depends on which of the two it is."""
    return {
        "type": "object",
        "properties": {**result["properties"], "error": TOOL_ERROR},
        "anyOf": [
            {"required": result["required"], "not": {"required": ["error"]}},
            {"required": ["error"], "maxProperties": 1},
        ],
    }


def lasting_effects(policy: McpPolicy) -> bool:
    """Whether a command can change something that outlives its sandbox: a writable bind
    mount or volume of the operator's, or the world a network reaches."""
    base = policy.base
    writable = any(not isinstance(m, TmpfsMount) and not m.read_only for m in base.mounts)
    return writable or open_world(policy)


def open_world(policy: McpPolicy) -> bool:
    return policy.base.network != "none"


def tool_annotations(policy: McpPolicy) -> dict[str, dict[str, Any]]:
    """Each tool's MCP annotations, true of this server's sandboxes. Commands are not
    read-only (they create a container and may change what is in it); they are destructive
    and not idempotent only when they can reach past their sandbox (``lasting_effects``), and
    open-world only with a network. The file tools act on the sandbox alone."""
    lasting = lasting_effects(policy)
    reaches_out = open_world(policy)

    return {
        "run": hints("Run a command in a fresh sandbox", False, lasting, not lasting, reaches_out),
        "sandbox_open": hints("Open a sandbox", False, False, False, False),
        "sandbox_exec": hints("Run a command in an open sandbox", False, True, False, reaches_out),
        "sandbox_write_file": hints("Write a file in a sandbox", False, True, True, False),
        "sandbox_read_file": hints("Read a file from a sandbox", True, False, True, False),
        "sandbox_close": hints("Close a sandbox", False, True, True, False),
        "sandbox_list": hints("List my sandboxes", True, False, True, False),
    }


def limits_schema(ceilings: Limits, what: str) -> dict[str, Any]:
    """Each limit with its meaning and the operator's ceiling (also the default)."""
    properties: dict[str, Any] = {}
    for name, (field, is_size) in LIMIT_FIELDS.items():
        cap = getattr(ceilings, field)
        schema: dict[str, Any] = dict(SIZE if is_size else NUMBER if name != "pids" else INTEGER)
        if not is_size:
            schema["maximum"] = cap
        schema["description"] = (
            f"{_LIMIT_MEANINGS[name]}. At most {show(field, cap)} (the operator's limit, and "
            "the default)."
        )
        properties[name] = schema
    return {
        "type": "object",
        "description": f"Lower limits for {what}: each may be lowered, never raised above the "
        "operator's. Leave out what you do not need to change.",
        "properties": properties,
        "additionalProperties": False,
    }


def sandbox_summary(policy: McpPolicy) -> str:
    """The sandbox in one sentence, as this server makes it."""
    base = policy.base
    network = network_phrase(base.network)
    mounts = ""
    if base.mounts:
        places = ", ".join(
            f"{mount.target} ({'writable' if _writable(mount) else 'read-only'})"
            for mount in base.mounts
        )
        mounts = f"; the operator's mounts: {places}"
    return (
        f"a fresh Linux container ({network}, read-only root filesystem, non-root user "
        f"{base.user or 'of its own'}, no capabilities; writable: {FILES_ROOT} "
        f"({show('scratch_bytes', base.limits.scratch_bytes)}) and /dev/shm{mounts})"
    )


def network_phrase(network: str | Network) -> str:
    """The network as a model should read it: never a Python repr."""
    if isinstance(network, str):
        return "no network" if network == "none" else f"the {network} network"
    reach = "the managed network" if network.mode == "managed" else "no network"
    if network.allow:
        reach += " except, through sbxkit's proxy, " + ", ".join(network.allow)
    if network.callback is not None:
        reach += f"; a host endpoint {network.callback} as $SBXKIT_ENDPOINT"
    if network.inject:
        hosts = ", ".join(sorted({rule.host for rule in network.inject}))
        reach += f"; the proxy adds the credentials for {hosts}: call them without a key"
    if network.ports:
        shown = ", ".join(str(port) for port in network.ports)
        reach += (
            f"; inbound ports {shown} forwarded from the host to the sandbox's 127.0.0.1 "
            "(the result's ports name the host's side)"
        )
    return reach


def _writable(mount: Mount) -> bool:
    return isinstance(mount, TmpfsMount) or not mount.read_only


def _image(policy: McpPolicy) -> dict[str, Any]:
    return {
        "type": "string",
        "enum": list(policy.images),
        "description": f"The container image; default {policy.base.image}. Only these are allowed.",
    }


def _results(what: str) -> str:
    return (
        f"Returns status: exited (exit_code is {what}'s), timed_out, output_exceeded "
        "(overflowed names the stream that hit max_output), oom_killed or killed (evidence "
        "says what decided); stdout and stderr as text, each capped at max_output bytes "
        "(stdout_bytes and stderr_bytes count what was kept). A command that fails is a "
        "result, not an error: read its status and exit_code."
    )


def tool_definitions(policy: McpPolicy) -> list[dict[str, Any]]:
    """Every tool as MCP lists it: name, description, inputSchema, outputSchema."""
    options = policy.options
    summary = sandbox_summary(policy)
    ceilings = policy.ceilings
    size = f"{policy.file_bytes} bytes"
    path = {
        "type": "string",
        "description": f"A path under {FILES_ROOT}: relative to it (src/main.py) or absolute "
        f"inside it (/tmp/src/main.py).",
    }
    tools: list[dict[str, Any]] = [
        {
            "name": "run",
            "description": f"Run one command in {summary}, created for this call and removed "
            f"after it; nothing persists between calls (use sandbox_open for several steps). "
            f"Files you pass are written under {FILES_ROOT} first; the command starts in "
            f"{policy.base.workdir}. {_results('the command')}",
            "inputSchema": obj(
                {
                    "command": COMMAND,
                    "stdin": STDIN,
                    "files": {
                        "type": "object",
                        "additionalProperties": STRING,
                        "description": f"Files to create before the command runs: a path "
                        f"relative to {FILES_ROOT} → its text (UTF-8), e.g. "
                        '{"main.py": "print(1)"}. At most ' + f"{size} together.",
                    },
                    "image": _image(policy),
                    "limits": limits_schema(ceilings, "this run"),
                    "env": env_schema("the command"),
                },
                ["command"],
            ),
            "outputSchema": COMMAND_RESULT,
        },
        {
            "name": "sandbox_open",
            "description": f"Open a sandbox that stays for several calls: {summary}. Returns "
            "its sandbox_id for sandbox_exec, sandbox_write_file, sandbox_read_file and "
            "sandbox_close. It is removed when you close it, after "
            f"{options.idle_timeout:g} s without a call, when its lifetime ends (at most "
            f"{options.lifetime:g} s), or when this client disconnects. At most "
            f"{options.max_sandboxes_per_client} sandboxes open or running per client.",
            "inputSchema": obj(
                {
                    "image": _image(policy),
                    "limits": limits_schema(
                        ceilings,
                        "this sandbox (timeout and max_output are each command's default "
                        "and ceiling)",
                    ),
                    "lifetime": {
                        "type": "number",
                        "maximum": options.lifetime,
                        "description": "Seconds until the sandbox is removed, however it is "
                        f"used; at most and by default {options.lifetime:g}.",
                    },
                    "env": env_schema("every command in the sandbox"),
                },
                [],
            ),
            "outputSchema": SANDBOX,
        },
        {
            "name": "sandbox_exec",
            "description": "Run one command in an open sandbox. Files and changes under "
            f"{FILES_ROOT} stay for the next calls; the command's processes are killed when it "
            f"times out or overflows. {_results('the command')}",
            "inputSchema": obj(
                {
                    "sandbox_id": SANDBOX_ID,
                    "command": COMMAND,
                    "stdin": STDIN,
                    "timeout": {
                        "type": "number",
                        "description": "Seconds this command may run; at most and by default "
                        "the sandbox's limits.timeout.",
                    },
                    "max_output": {
                        **SIZE,
                        "description": "Bytes kept of stdout and of stderr each; at most and "
                        "by default the sandbox's limits.max_output.",
                    },
                    "cwd": {
                        "type": "string",
                        "description": "Absolute directory the command starts in (default "
                        f"{policy.base.workdir}).",
                    },
                    "env": env_schema("this command"),
                },
                ["sandbox_id", "command"],
            ),
            "outputSchema": COMMAND_RESULT,
        },
        {
            "name": "sandbox_write_file",
            "description": f"Write a file in an open sandbox, under {FILES_ROOT} (missing "
            f"directories are created, an existing file is replaced). At most {size}.",
            "inputSchema": obj(
                {
                    "sandbox_id": SANDBOX_ID,
                    "path": path,
                    "content": {"type": "string", "description": "The file's content."},
                    "encoding": ENCODING,
                },
                ["sandbox_id", "path", "content"],
            ),
            "outputSchema": FILE_WRITTEN,
        },
        {
            "name": "sandbox_read_file",
            "description": f"Read a regular file from an open sandbox, under {FILES_ROOT}. "
            "Text comes back as UTF-8; a file that is not UTF-8 is refused unless encoding is "
            f"base64. At most {size}.",
            "inputSchema": obj(
                {"sandbox_id": SANDBOX_ID, "path": path, "encoding": ENCODING},
                ["sandbox_id", "path"],
            ),
            "outputSchema": FILE_READ,
        },
        {
            "name": "sandbox_close",
            "description": "Close an open sandbox: its container and every process in it are "
            "removed before this returns.",
            "inputSchema": obj({"sandbox_id": SANDBOX_ID}, ["sandbox_id"]),
            "outputSchema": CLOSED,
        },
        {
            "name": "sandbox_list",
            "description": "List the open sandboxes of this session (time left, idle time, "
            "limits), and how many of its quota this client holds.",
            "inputSchema": obj({}, []),
            "outputSchema": SANDBOX_LIST,
        },
        *process_tool_definitions(policy),
        python_tool_definition(policy),
    ]
    assert [tool["name"] for tool in tools] == list(ARGS), "a tool without its arguments"
    reaches_out = open_world(policy)
    hinted = {
        **tool_annotations(policy),
        **process_annotations(reaches_out),
        **python_annotations(reaches_out),
    }
    for tool in tools:
        if "error" not in tool["outputSchema"]["properties"]:
            tool["outputSchema"] = admitting_errors(tool["outputSchema"])
        tool["annotations"] = hinted[tool["name"]]
        tool["title"] = hinted[tool["name"]]["title"]
    return tools
