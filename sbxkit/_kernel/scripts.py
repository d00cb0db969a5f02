"""The shell that puts a sandbox's stdio on host FIFOs (pure).

The FIFOs live in one host directory per lease, bind-mounted read-only at ``IO_TARGET`` (a
FIFO opens for writing on a read-only mount). The host opens its ends before the container
starts — the read ends of ``out`` and ``err``, and ``in`` read-write (a FIFO opened read-write
never blocks) — so each ``open`` in the container completes at once.

Both first redirect and write one sync byte (``SYNC_BYTE``) on ``err``: the host's proof that
the shell runs and the payload has not (a container that dies before it never ran its payload,
and is re-run on the daemon's path). Then each waits for one line on ``in`` — the host opens
the init's pidfd while the shell is blocked there, so the process it verifies is alive:

- the command is ``sh -c SCRIPT sh ARGV...``: the line is empty (``GO_LINE``), then
  ``exec "$@"`` — the argv rides as positional parameters, never as shell text;
- a parked container's ARGV is the parked shell of the daemon's path (``sbxkit/pool/line.py``),
  which then reads its claim line from the same ``in`` FIFO.

Both drop what the shell itself exports (dash: ``PWD``; busybox ash: ``PWD``, ``SHLVL``) and
put back the container's own values of those keys, so the payload's environment is a daemon
path run's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

import msgspec

from sbxkit._model.mounts import ExpectedMount
from sbxkit.engine.models import ContainerCreate

__all__ = [
    "GO_LINE",
    "IO_BIND_OPTIONS",
    "IO_TARGET",
    "SHELL_OWN_KEYS",
    "SYNC_BYTE",
    "cold_command",
    "io_bind",
    "io_dir_of",
    "io_root",
    "kernel_io",
    "redirect",
    "restore_shell_keys",
    "shell_carries",
]

IO_TARGET = "/.sbxkit/io"
"""Where a sandbox sees its FIFO directory (``/.sbxkit`` is reserved: no mount may go there)."""
IO_BIND_OPTIONS = "ro,rprivate"
SYNC_BYTE = b"R"
SHELL_OWN_KEYS = ("PWD", "OLDPWD", "SHLVL")
"""What a POSIX shell adds to its own environment; unset before the payload's ``exec``."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHELL_MANGLED = frozenset({"OPTIND"})  # dash drops a value it cannot parse


def shell_carries(key: str) -> bool:
    """An environment key a POSIX shell passes on to what it ``exec``s: a shell name it
    leaves alone (dash and busybox ash drop ``A-B``, ``ÄKEY`` and their like)."""
    return _NAME.fullmatch(key) is not None and key not in _SHELL_MANGLED


def redirect(io_target: str = IO_TARGET) -> str:
    return f"exec <{io_target}/in >{io_target}/out 2>{io_target}/err"


def restore_shell_keys(env: Mapping[str, str]) -> str:
    """``unset PWD OLDPWD SHLVL;`` then the container's own values of those keys back."""
    back = "".join(
        f"export {key}={shlex.quote(env[key])}; " for key in SHELL_OWN_KEYS if key in env
    )
    return f"unset {' '.join(SHELL_OWN_KEYS)}; {back}"


GO_LINE = b"\n"
"""What the host writes to let a cold run's payload start (once it holds the init's pidfd)."""


def cold_command(
    command: list[str], container_env: Mapping[str, str], *, io_target: str = IO_TARGET
) -> list[str]:
    """A sandbox's command on the kernel path: wire the FIFOs, say so, wait for the host's
    go (``GO_LINE``: the host opens the init's pidfd while the shell is blocked here, so the
    process it verifies is alive), then ``exec`` the argv as given — positional parameters,
    never shell text. ``container_env`` is the image's environment with the spec's over it.
    A parked container's argv is the parked shell (``sbxkit/pool/line.py``), which then reads
    its claim line from the same FIFO."""
    script = (
        f"{redirect(io_target)}; printf R >&2; IFS= read -r go; "
        f'{restore_shell_keys(container_env)}exec "$@"'
    )
    return ["sh", "-c", script, "sh", *command]


def io_root(state_dir: Path) -> Path:
    """Where the FIFO directories of a state directory's leases live: ``<state_dir>.io``, a
    sibling both the caller and its supervisor find from the state directory alone."""
    return state_dir.parent / f"{state_dir.name}.io"


def io_bind(io_dir: str) -> str:
    """The bind that shows a lease's FIFO directory to its sandbox, read-only."""
    return f"{io_dir}:{IO_TARGET}:{IO_BIND_OPTIONS}"


def kernel_io(
    body: ContainerCreate, io_dir: str, container_env: Mapping[str, str]
) -> tuple[ContainerCreate, ExpectedMount]:
    """``body`` on the kernel path: its command wrapped (``cold_command``), its FIFO directory
    bound read-only at ``IO_TARGET``; and the mount its verification must find. Its stdin is
    not the daemon's to hold open (nothing attaches: the FIFOs carry the stdio), which spares
    the daemon a stdin pipe per container (1-1.5 ms of create and start here, docs/pool.md)."""
    host = body.host_config
    assert host is not None  # policy's hardened body
    assert body.cmd is not None
    binds = [*(host.binds or []), io_bind(io_dir)]
    wrapped = msgspec.structs.replace(
        body,
        cmd=cold_command(list(body.cmd), container_env),
        attach_stdin=False,
        attach_stdout=False,
        attach_stderr=False,
        open_stdin=False,
        stdin_once=False,
        host_config=msgspec.structs.replace(host, binds=binds),
    )
    return wrapped, ExpectedMount(type="bind", source=io_dir, destination=IO_TARGET, rw=False)


def io_dir_of(body: ContainerCreate) -> str | None:
    """The FIFO directory a body binds on the kernel path, or None (the daemon's path)."""
    for bind in (body.host_config.binds if body.host_config else None) or []:
        source, _, rest = bind.partition(":")
        if rest == f"{IO_TARGET}:{IO_BIND_OPTIONS}":
            return source
    return None
