"""docker's spellings on sbxkit's command line (pure, apart from reading an ``--env-file``).

Where sbxkit means the same thing, docker's flag is taken: ``-e``, ``-m``, ``-w``, ``-u``
(short forms in ``flags.add_sandbox_flags``), ``-l``, ``-i``, ``--env-file``,
``--entrypoint``, ``-v``/``--volume`` and ``--mount`` (bind mounts, named volumes and tmpfs,
under the policy a profile's mounts have), ``--name`` (a label: sbxkit names its containers
itself) and ``--rm``/``--read-only`` (what sbxkit always does). Every other docker flag gets a
sentence saying what to use instead (``advice``), and a typo the nearest flag (``did you
mean``).
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Sequence

from sbxkit._model.mounts import BindMount, Mount, TmpfsMount, VolumeMount
from sbxkit._model.units import parse_size
from sbxkit.errors import SpecError

NAME_LABEL = "sbxkit.name"
"""Where ``--name`` goes: a label, since sbxkit names its containers for their leases."""
MAX_ENV_FILE_BYTES = 1024 * 1024

INSTEAD: dict[str, str] = {
    "-d": "a sandbox that stays is sbxkit open IMAGE, then sbxkit exec NAME -- CMD",
    "--detach": "a sandbox that stays is sbxkit open IMAGE, then sbxkit exec NAME -- CMD",
    "-t": "sbxkit run has no terminal; sbxkit shell IMAGE [-- CMD] gives one",
    "--tty": "sbxkit run has no terminal; sbxkit shell IMAGE [-- CMD] gives one",
    "-p": "--port [ADDR:][HOST_PORT:]PORT forwards a host port into the sandbox's loopback",
    "--publish": "--port [ADDR:][HOST_PORT:]PORT forwards a host port into the sandbox's loopback",
    "-P": "name each port with --port PORT (the host side is a free port of 127.0.0.1)",
    "--privileged": "never: a sandbox runs without capabilities (docs/security.md); "
    "--workspace gives root inside where it is not root on the host",
    "--cap-add": "capabilities are fixed (none; five for --workspace: docs/workspace.md)",
    "--cap-drop": "every capability is already dropped",
    "--security-opt": "the hardened options are fixed; --runtime gvisor adds isolation",
    "--pull": "sbxkit never pulls: load or build the image first",
    "--platform": "the image runs as the daemon has it; sbxkit never pulls",
    "--restart": "a sandbox runs once and is removed",
    "--memory-swap": "swap is always off: --memory is the whole budget",
    "--cpuset-cpus": "--cpus sets a CPU quota",
    "--cpu-shares": "--cpus sets a CPU quota",
    "--pids-limit": "--pids",
    "--ulimit": "--fsize and --pids; the other limits are fixed",
    "--device": "--gpus for CDI devices; no other devices",
    "--hostname": "the hostname is fixed; --allow HOST governs what the sandbox reaches",
    "--add-host": "--allow HOST governs what the sandbox reaches, by name",
    "--dns": "--allow HOST governs what the sandbox reaches, by name",
    "--tmpfs": "--mount type=tmpfs,target=PATH,tmpfs-size=SIZE (a tmpfs is always bounded)",
    "--init": "sbxkit always runs an init as the container's first process",
    "--log-driver": "output comes back on stdout and stderr, bounded by --max-output",
    "--group-add": "--user UID:GID; no supplementary groups",
    "--userns": "a daemon's --userns-remap, a rootless engine or gVisor: docs/workspace.md",
    "--ipc": "IPC is private to the sandbox",
    "--pid": "the process namespace is private to the sandbox",
    "--cgroupns": "the cgroup namespace is private to the sandbox",
}
"""docker flags with no sbxkit spelling, and what to use instead."""


def add_docker_flags(parser: argparse.ArgumentParser, *, stdin: bool) -> None:
    """``run``'s docker spellings (``stdin``: it also takes ``-i``)."""
    if stdin:
        parser.add_argument(
            "-i", "--interactive", action="store_true", help="send this stdin (--stdin -)"
        )
        parser.add_argument(
            "-t", "--tty", action="store_true", help="refused: sbxkit shell gives a terminal"
        )
    parser.add_argument(
        "--env-file", action="append", default=[], metavar="FILE", help="K=V lines, as docker's"
    )
    parser.add_argument(
        "--entrypoint", metavar="CMD", help="run CMD with the command as its arguments"
    )
    parser.add_argument(
        "-v",
        "--volume",
        action="append",
        default=[],
        metavar="SRC:DST[:ro|rw]",
        help="a bind mount (SRC a host path) or a named volume; read-only unless :rw; "
        "the operator enables them (enable_bind_mounts, enable_named_volumes)",
    )
    parser.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="type=bind|volume|tmpfs,...",
        help="docker's --mount: source=, target=, readonly, tmpfs-size=",
    )
    parser.add_argument("--name", help=f"a name for the run, as the label {NAME_LABEL}")
    parser.add_argument("--rm", action="store_true", help="accepted: sbxkit always removes it")
    parser.add_argument(
        "--read-only", action="store_true", help="accepted: the root filesystem always is"
    )


def env_file_pairs(paths: Sequence[str]) -> list[str]:
    """docker's ``--env-file``: ``K=V`` lines; blank lines and ``#`` comments skipped; a bare
    ``K`` passes the host's value, as ``--env K`` does."""
    pairs: list[str] = []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_ENV_FILE_BYTES + 1)
        except OSError as exc:
            raise SpecError("--env-file", f"cannot read {path}: {exc.strerror}") from None
        if len(data) > MAX_ENV_FILE_BYTES:
            raise SpecError("--env-file", f"{path} is over {MAX_ENV_FILE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError("--env-file", f"{path} is not UTF-8") from None
        for line in text.splitlines():
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                pairs.append(stripped)
    return pairs


def volume_mount(text: str) -> Mount:
    """``-v SRC:DST[:ro|rw]``: a bind mount when SRC is a path, else a named volume."""
    parts = text.split(":")
    mode = "ro"
    if len(parts) == 3:
        source, target, mode = parts
    elif len(parts) == 2:
        source, target = parts
    else:
        raise SpecError(f"-v {text}", "must be SRC:DST or SRC:DST:ro|rw")
    if mode not in ("ro", "rw"):
        raise SpecError(f"-v {text}", f"mode {mode!r}: ro or rw (read-only is the default)")
    if not source or not target:
        raise SpecError(f"-v {text}", "must be SRC:DST, both given")
    read_only = mode == "ro"
    if source.startswith(("/", ".", "~")):
        host = os.path.abspath(os.path.expanduser(source))
        return BindMount(source=host, target=target, read_only=read_only)
    return VolumeMount(source=source, target=target, read_only=read_only)


def mount_option(text: str) -> Mount:
    """docker's ``--mount type=...,source=...,target=...[,readonly][,tmpfs-size=...]``."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        fields[key.strip()] = value.strip() if eq else "true"
    kind = fields.pop("type", "volume")
    source = fields.pop("source", None) or fields.pop("src", None)
    target = (
        fields.pop("target", None) or fields.pop("destination", None) or fields.pop("dst", None)
    )
    readonly = fields.pop("readonly", fields.pop("ro", "false")).lower() in ("true", "1", "")
    size = fields.pop("tmpfs-size", None)
    where = f"--mount {text}"
    if fields:
        raise SpecError(where, f"unknown option {sorted(fields)[0]!r}")
    if not target:
        raise SpecError(where, "target= is required")
    if kind == "tmpfs":
        if size is None:
            raise SpecError(where, "tmpfs-size= is required: a tmpfs is always bounded")
        return TmpfsMount(target=target, size_bytes=parse_size(size, where))
    if not source:
        raise SpecError(where, "source= is required")
    if kind == "bind":
        return BindMount(source=os.path.abspath(source), target=target, read_only=readonly)
    if kind == "volume":
        return VolumeMount(source=source, target=target, read_only=readonly)
    raise SpecError(where, f"type {kind!r}: bind, volume or tmpfs")


def mounts_from_args(args: argparse.Namespace) -> list[Mount]:
    return [
        *(volume_mount(text) for text in getattr(args, "volume", None) or []),
        *(mount_option(text) for text in getattr(args, "mount", None) or []),
    ]


def user_flag(text: str) -> str:
    """``--user UID`` as docker takes it: the uid, and a group of the same number (sbxkit never
    gives a sandbox the root group)."""
    if text.isascii() and text.isdigit():
        return f"{text}:{text}"
    return text


def advice(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """The usage error for unknown flags: what to use instead, or the nearest flag."""
    word = next((w for w in unknown if w.startswith("-")), unknown[0])
    flag = word.partition("=")[0]
    if flag in INSTEAD:
        return f"{flag}: not a flag of sbxkit's: {INSTEAD[flag]}"
    known = [o for action in parser._actions for o in action.option_strings]
    near = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return "unrecognized arguments: " + " ".join(unknown) + hint
