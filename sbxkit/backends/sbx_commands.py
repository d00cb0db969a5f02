"""Every ``sbx`` invocation the microVM runner makes, as pure argv builders, plus the parsers.

Docker's ``sbx`` CLI (Docker Sandboxes) exists neither in CI nor on the machines sbxkit is
developed on, and Docker documents its surface as subject to change. So each command is built
here by one pure function with a unit test saying what its argv means; ``sbxkit.backends.sbx``
only runs what these return. No I/O, no trio, no randomness: strings in, argv lists out.

What the commands rely on (docs.docker.com/reference/cli/sbx, not verified against a real
binary; docs/adr-sbx.md lists each assumption and the check that closes it):

- ``sbx create AGENT [flags] PATH``: a microVM sandbox for an agent (``shell`` is "no agent at
  all") with the host directory PATH mounted **at the same path** inside. There is no
  ``source:target`` form, so the exec script symlinks each target path to the workspace.
- ``sbx exec [flags] SANDBOX COMMAND [ARG...]``: flags "match docker exec". The environment is
  never passed with ``-e``/``--env-file``: it travels on stdin (``encode_env``), so no value
  reaches a process list on either side of the VM boundary.
- ``sbx policy allow network --sandbox NAME localhost:PORT``: egress leaves the VM only through
  a host proxy that rewrites ``host.docker.internal`` to ``localhost`` and denies it unless a
  rule allows it; one rule per host port, scoped to the sandbox so it dies with it.
- ``sbx rm --force NAME``: stop and delete without a prompt; it is also the kill.
- ``sbx ls --json``: the sandboxes, for startup orphan reconciliation. The JSON's shape is not
  documented, so the parser is tolerant and returns names only.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from sbxkit._model.predicates import has_control
from sbxkit.errors import SandboxListError, SpecError

__all__ = [
    "DEFAULT_AGENT",
    "DEFAULT_BINARY",
    "DEFAULT_USER",
    "ENV_END",
    "EXEC_SETUP_FAILED",
    "NAME_PREFIX",
    "SandboxListError",
    "check_agent",
    "check_binary",
    "check_create_args",
    "check_host_ports",
    "check_kits",
    "check_runner_id",
    "check_sandbox_fields",
    "check_workspace",
    "encode_env",
    "owner_of",
    "parse_sandbox_list",
    "runner_prefix",
    "sandbox_name",
    "sbx_create_args",
    "sbx_exec_args",
    "sbx_exec_script",
    "sbx_list_args",
    "sbx_policy_args",
    "sbx_remove_args",
]

DEFAULT_BINARY = "sbx"
DEFAULT_AGENT = "shell"
"""``sbx create shell``: the common base environment with no agent binary installed."""

DEFAULT_USER = "65534:65534"
"""``SandboxSpec.user``'s default; any other user is refused under this runtime."""

NAME_PREFIX = "sbxkit-"
"""Every sandbox this runner creates is named ``sbxkit-<runner id>-<run id>``."""

EXEC_PROGRAM = "sbxkit-exec"
"""``$0`` of the exec script (what its error messages start with)."""

EXEC_SETUP_FAILED = 125
"""The exec script's exit status when it could not set up (link, environment, cwd)."""

ENV_END = "."
"""The line that ends the environment on the exec's stdin; the payload's stdin follows it."""

_RUNNER_ID_RE = re.compile(r"[a-z0-9]{1,24}")
_RUN_ID_RE = re.compile(r"[0-9a-f]{16}")
_NAME_RE = re.compile(r"sbxkit-([a-z0-9]{1,24})-([0-9a-f]{16})")
_AGENT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SANDBOX_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")
"""What ``sbx`` accepts as a name: letters, numbers, hyphens, periods and plus signs."""
_SHELL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCRIPT_VARIABLE_PREFIX = "sbxkit_"
"""The exec script's own shell variables; environment keys may not use the prefix."""

# Flags of ``sbx create`` the runner owns: the name is how removal and orphan reconciliation
# find the sandbox, and the template is the spec's image (named once).
_OWNED_CREATE_FLAGS = ("--name", "--template", "-t")
_PORT_MAX = 65535


# --- names --------------------------------------------------------------------------------------


def check_runner_id(runner_id: object, field: str = "runner_id") -> str:
    """A runner id: 1–24 lowercase letters and digits (no ``-``, so names parse back)."""
    if not isinstance(runner_id, str) or _RUNNER_ID_RE.fullmatch(runner_id) is None:
        raise SpecError(field, "must be 1-24 lowercase letters or digits")
    return runner_id


def sandbox_name(runner_id: str, run_id: str) -> str:
    """``sbxkit-<runner id>-<run id>``: the runner id says whose it is, the run id which run."""
    check_runner_id(runner_id)
    if _RUN_ID_RE.fullmatch(run_id) is None:
        raise SpecError("run_id", "must be 16 lowercase hex digits")
    return f"{NAME_PREFIX}{runner_id}-{run_id}"


def runner_prefix(runner_id: str) -> str:
    """The prefix of every sandbox name one runner creates (``sbxkit-<runner id>-``)."""
    return f"{NAME_PREFIX}{check_runner_id(runner_id)}-"


def owner_of(name: str) -> str | None:
    """The runner id in a name ``sandbox_name`` built, or None for anybody else's sandbox."""
    match = _NAME_RE.fullmatch(name)
    return match.group(1) if match else None


# --- configuration checks ------------------------------------------------------------------------


def check_binary(binary: object, field: str = "binary") -> str:
    """``sbx`` (looked up on PATH) or an absolute path; never a relative path or flags."""
    if not isinstance(binary, str) or not binary:
        raise SpecError(field, "must be a program name or an absolute path")
    if has_control(binary) or binary.startswith("-"):
        raise SpecError(field, "must not contain control characters or start with '-'")
    if "/" in binary and not binary.startswith("/"):
        raise SpecError(field, "must be a bare program name (found on PATH) or an absolute path")
    if ".." in binary.split("/"):
        raise SpecError(field, "must not contain '..'")
    return binary


def check_agent(agent: object, field: str = "agent") -> str:
    """The ``sbx create`` agent positional: a plain lowercase name such as ``shell``."""
    if not isinstance(agent, str) or _AGENT_RE.fullmatch(agent) is None:
        raise SpecError(field, "must be an agent name such as 'shell' ([a-z0-9][a-z0-9._-]*)")
    return agent


def check_kits(kits: object, field: str = "kits") -> list[str]:
    """Kit references (directory, ZIP or OCI), each passed as one ``--kit`` value."""
    if not isinstance(kits, list):
        raise SpecError(field, "must be a list of kit references")
    for index, kit in enumerate(kits):
        where = f"{field}[{index}]"
        if not isinstance(kit, str) or not kit.strip():
            raise SpecError(where, "must be a non-empty string")
        if has_control(kit) or kit.startswith("-"):
            raise SpecError(where, "must not contain control characters or start with '-'")
    return kits


def check_create_args(args: object, field: str = "create_args") -> list[str]:
    """Extra ``sbx create`` arguments (the escape hatch, e.g. ``["--memory", "8g"]``).

    ``--name`` and ``--template``/``-t`` are refused: the name is how the runner removes the
    sandbox and finds its orphans, and the template is the spec's image.
    """
    if not isinstance(args, list):
        raise SpecError(field, "must be a list of strings")
    for index, arg in enumerate(args):
        where = f"{field}[{index}]"
        if not isinstance(arg, str) or not arg:
            raise SpecError(where, "must be a non-empty string")
        if has_control(arg):
            raise SpecError(where, "must not contain control characters")
        flag = arg.split("=", 1)[0]
        if flag in _OWNED_CREATE_FLAGS or (arg.startswith("-t") and not arg.startswith("--")):
            raise SpecError(
                where,
                f"{flag} is set by sbxkit (the name finds the sandbox for removal; the "
                "template is the spec's image)",
            )
    return args


def check_host_ports(ports: object, field: str = "host_ports") -> list[int]:
    """Host TCP ports a run may reach through the proxy: ints 1–65535, no duplicates."""
    if not isinstance(ports, list | tuple):
        raise SpecError(field, "must be a list of port numbers")
    seen: set[int] = set()
    for index, port in enumerate(ports):
        where = f"{field}[{index}]"
        if isinstance(port, bool) or not isinstance(port, int):
            raise SpecError(where, "must be an integer port number")
        if not 1 <= port <= _PORT_MAX:
            raise SpecError(where, f"must be between 1 and {_PORT_MAX}")
        if port in seen:
            raise SpecError(where, f"port {port} is listed twice")
        seen.add(port)
    return list(ports)


def check_workspace(path: object, field: str = "workspace") -> str:
    """The workspace's host path: absolute, plain (``:`` would read as ``PATH:ro``)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise SpecError(field, "must be an absolute host path")
    if has_control(path) or ":" in path or ".." in path.split("/"):
        raise SpecError(field, "must not contain control characters, ':' or '..'")
    return path


def check_sandbox_fields(
    *,
    network: str | None,
    user: str | None,
    runtime: str | None,
    mounts: Sequence[object],
    gpus: object,
    labels: Mapping[str, str],
    extra_flags: Sequence[str],
    env: Mapping[str, str],
    workspace: object = None,
) -> None:
    """Refuse what the sandbox runtime cannot honour, naming the field.

    Each of these would otherwise be silently dropped or could only fail later, inside the VM:
    the network is the machine's ``sbx policy`` (sbxkit adds only per-run host-port grants),
    the user is the template's, there is no OCI runtime, no mount but the workspace, no GPU
    request, and no container labels. Environment keys must be shell names because the exec
    script exports them.
    """
    if network not in (None, "none"):
        raise SpecError(
            "network",
            "under the sandbox runtime egress is governed by the machine's sbx policy; "
            "sbxkit only adds per-run host-port grants, so only 'none' is accepted",
        )
    if user not in (None, DEFAULT_USER):
        raise SpecError(
            "user", "under the sandbox runtime commands run as the template's (non-root) user"
        )
    if runtime is not None:
        raise SpecError("runtime", "a microVM has no OCI runtime to choose")
    if workspace is not None:
        raise SpecError("workspace", "under the sandbox runtime the microVM is the workspace")
    if mounts:
        raise SpecError(
            "mounts",
            "under the sandbox runtime the only mount is the run's workspace (bind, volume "
            "and tmpfs mounts are refused)",
        )
    if gpus is not None:
        raise SpecError("gpus", "GPUs are not available under the sandbox runtime")
    if labels:
        raise SpecError("labels", "sandboxes have no container labels")
    if extra_flags:
        raise SpecError(
            "extra_flags", "sandboxes have no container labels (the only extra flag is --label)"
        )
    for key in env:
        if _SHELL_NAME_RE.fullmatch(key) is None:
            raise SpecError(
                f"env[{key!r}]",
                "under the sandbox runtime keys must be shell names ([A-Za-z_][A-Za-z0-9_]*)",
            )
        if key.startswith(_SCRIPT_VARIABLE_PREFIX):
            raise SpecError(f"env[{key!r}]", f"the {_SCRIPT_VARIABLE_PREFIX}* prefix is reserved")


# --- argv builders ------------------------------------------------------------------------------


def sbx_create_args(
    binary: str,
    *,
    name: str,
    agent: str,
    workspace: str,
    template: str,
    kits: Sequence[str] = (),
    create_args: Sequence[str] = (),
) -> list[str]:
    """``sbx create AGENT --name NAME --template IMAGE [--kit K]... [EXTRA...] WORKSPACE``.

    The agent is the subcommand-like positional (``sbx create shell``); flags follow it, so
    they are parsed as that subcommand's own. The workspace is passed at its host path, where
    the sandbox mounts it. ``create_args`` are inserted before the workspace, unmodified.
    """
    check_binary(binary)
    check_agent(agent)
    check_workspace(workspace)
    check_kits(list(kits))
    check_create_args(list(create_args))
    if _SANDBOX_NAME_RE.fullmatch(name) is None:
        raise SpecError("name", "not a sandbox name")
    argv = [binary, "create", agent, "--name", name, "--template", template]
    for kit in kits:
        argv += ["--kit", kit]
    return [*argv, *create_args, workspace]


def sbx_exec_script(links: Sequence[tuple[str, str]], cwd: str) -> str:
    """The ``sh -c`` script every run's command goes through, inside the sandbox.

    1. For each ``(target, host_path)`` whose paths differ, make ``target`` a symlink to the
       workspace's host path (creating parents; with ``sudo -n`` if the template's user cannot
       write there). An existing non-link at ``target`` is an error, never overwritten.
    2. Read the environment from stdin: one ``KEY ESCAPED`` line per variable, then a line
       ``.``. ``ESCAPED`` is ``printf %b`` text (``encode_env``). The shell's ``read`` takes
       exactly those lines, so everything after them is left as the command's stdin.
    3. ``cd`` to ``cwd`` and ``exec "$@"``: the command replaces the shell.

    Any setup failure exits with ``EXEC_SETUP_FAILED`` (125) and a ``sbxkit-exec:`` message.
    Nothing secret is in the script: it travels in argv.
    """
    if not cwd.startswith("/") or has_control(cwd):
        raise SpecError("cwd", "must be an absolute path")
    q = shlex.quote
    lines = [
        "set -u",
        "sbxkit_fail() { printf '%s: %s\\n' " + q(EXEC_PROGRAM) + ' "$1" >&2; '
        f"exit {EXEC_SETUP_FAILED}; }}",
        "sbxkit_link() {",
        '  if [ -L "$1" ] && [ "$(readlink "$1")" = "$2" ]; then return 0; fi',
        '  if [ -e "$1" ] || [ -L "$1" ]; then',
        '    sbxkit_fail "$1 exists and is not the workspace"',
        "  fi",
        '  sbxkit_parent=$(dirname "$1")',
        '  { mkdir -p "$sbxkit_parent" && ln -s "$2" "$1"; } 2>/dev/null && return 0',
        '  { sudo -n mkdir -p "$sbxkit_parent" && sudo -n ln -s "$2" "$1"; } 2>/dev/null '
        "&& return 0",
        '  sbxkit_fail "cannot link $1 to the workspace $2"',
        "}",
    ]
    for target, host_path in links:
        for path in (target, host_path):
            if not path.startswith("/") or has_control(path):
                raise SpecError("links", f"{path!r}: must be an absolute path")
        if target.rstrip("/") != host_path.rstrip("/"):
            lines.append(f"sbxkit_link {q(target)} {q(host_path)}")
    lines += [
        "sbxkit_ok=",
        "while IFS= read -r sbxkit_line; do",
        f'  if [ "$sbxkit_line" = {q(ENV_END)} ]; then sbxkit_ok=1; break; fi',
        "  sbxkit_key=${sbxkit_line%% *}",
        "  sbxkit_value=$(printf '%b_' \"${sbxkit_line#* }\")",
        '  export "$sbxkit_key=${sbxkit_value%_}" || sbxkit_fail "cannot set $sbxkit_key"',
        "done",
        '[ -n "$sbxkit_ok" ] || sbxkit_fail "the environment did not arrive on stdin"',
        "unset sbxkit_ok sbxkit_line sbxkit_key sbxkit_value",
        f"cd {q(cwd)} || sbxkit_fail {q('cannot enter ' + cwd)}",
        'exec "$@"',
    ]
    return "\n".join(lines) + "\n"


def encode_env(env: Mapping[str, str]) -> bytes:
    """The environment as the exec script reads it from stdin, ending with the ``.`` line.

    One line per variable: the key, a space, and the value's UTF-8 bytes with every byte
    outside printable ASCII (and space and backslash) written as ``\\0ooo`` — ``printf %b``'s
    octal escape, understood by dash, bash and busybox alike. So a line never contains a
    newline or a space after the key, and any value round-trips exactly (NUL is refused by the
    spec rules before this point).
    """
    out: list[str] = []
    for key, value in env.items():
        if _SHELL_NAME_RE.fullmatch(key) is None:
            raise SpecError(f"env[{key!r}]", "must be a shell name")
        if "\0" in value:
            raise SpecError(f"env[{key!r}]", "value must not contain NUL")
        escaped = "".join(
            chr(byte) if 0x21 <= byte <= 0x7E and byte != 0x5C else f"\\0{byte:03o}"
            for byte in value.encode("utf-8", "surrogatepass")
        )
        out.append(f"{key} {escaped}\n")
    out.append(ENV_END + "\n")
    return "".join(out).encode("ascii")


def sbx_exec_args(binary: str, name: str, script: str, command: Sequence[str]) -> list[str]:
    """``sbx exec -i -- NAME sh -c SCRIPT sbxkit-exec CMD...``.

    ``-i`` keeps stdin open (the environment, then the payload's stdin, arrive on it). ``--``
    comes *before* the name: it ends sbx's flags whether or not sbx parses flags after the
    first positional (docker exec does not), so ``-c`` is never taken for sbx's own.
    No ``-e``, ``--env-file``, ``-u`` or ``-w``: the environment is on stdin, the user is the
    template's, and the script changes directory after linking.
    """
    check_binary(binary)
    if _SANDBOX_NAME_RE.fullmatch(name) is None:
        raise SpecError("name", "not a sandbox name")
    if not command:
        raise SpecError("command", "must be a non-empty list of arguments")
    return [binary, "exec", "-i", "--", name, "sh", "-c", script, EXEC_PROGRAM, *command]


def sbx_policy_args(binary: str, name: str, host_ports: Sequence[int]) -> list[list[str]]:
    """One ``sbx policy allow network --sandbox NAME localhost:PORT`` per host port.

    The ports come from a typed list, never parsed out of an environment value. ``localhost``
    because the proxy rewrites ``host.docker.internal`` to it; ``--sandbox`` scopes the rule
    to this sandbox, so the grant dies with the run instead of opening the port to every
    sandbox on the machine.
    """
    check_binary(binary)
    if _SANDBOX_NAME_RE.fullmatch(name) is None:
        raise SpecError("name", "not a sandbox name")
    return [
        [binary, "policy", "allow", "network", "--sandbox", name, f"localhost:{port}"]
        for port in check_host_ports(list(host_ports))
    ]


def sbx_remove_args(binary: str, name: str) -> list[str]:
    """``sbx rm --force NAME``: stop and delete without a confirmation prompt (also the kill)."""
    check_binary(binary)
    if _SANDBOX_NAME_RE.fullmatch(name) is None:
        raise SpecError("name", "not a sandbox name")
    return [binary, "rm", "--force", name]


def sbx_list_args(binary: str) -> list[str]:
    """``sbx ls --json``: every sandbox of this user, as JSON (shape undocumented)."""
    return [check_binary(binary), "ls", "--json"]


# --- sbx ls -------------------------------------------------------------------------------------


_LIST_KEYS = ("sandboxes", "Sandboxes", "items", "Items", "data")
_NAME_KEYS = ("name", "Name", "sandbox", "Sandbox")


def _names_from_items(items: Iterable[object]) -> list[str]:
    names: list[str] = []
    for item in items:
        candidate: object = item
        if isinstance(item, dict):
            candidate = next((item[k] for k in _NAME_KEYS if k in item), None)
        if isinstance(candidate, str) and _SANDBOX_NAME_RE.fullmatch(candidate):
            names.append(candidate)
    return names


def _names_from_json(value: object) -> list[str] | None:
    if value is None:
        return []
    if isinstance(value, list):
        return _names_from_items(value)
    if isinstance(value, dict):
        for key in _LIST_KEYS:
            if key in value:
                inner = value[key]
                return _names_from_items(inner) if isinstance(inner, list) else []
    return None


def parse_sandbox_list(output: bytes | str) -> list[str]:
    """The sandbox names in ``sbx ls`` output, in order.

    JSON is preferred: a list of objects (or of names), or an object holding such a list
    under ``sandboxes``/``items``/``data``; ``null`` is empty. Whatever precedes the JSON
    (a banner, an update notice, log lines) is skipped: each line that starts with ``[`` or
    ``{`` is tried in turn until one decodes to a listing. Objects without a usable name are
    skipped rather than guessed at. Without JSON, a table whose header starts with ``NAME``
    gives its first column. Anything else raises ``SandboxListError``: an unreadable listing
    must not pass for an empty one.
    """
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    if not text.strip():
        return []
    decoder = json.JSONDecoder()
    offset = 0
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        start = offset + (len(line) - len(stripped))
        offset += len(line)
        if stripped.rstrip() == "null":
            return []
        if not stripped.startswith(("[", "{")):
            continue
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        names = _names_from_json(value)
        if names is not None:
            return names
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for index, words in enumerate(lines):
        if words[0].upper() in ("NAME", "SANDBOX"):
            return _names_from_items(row[0] for row in lines[index + 1 :])
    raise SandboxListError("no JSON listing and no NAME column found")
