"""Launching the supervisor: its command line, the daemon sockets it may serve, a detached
start that survives its caller, and one launch at a time per state directory in a trio run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from sbxkit._lifecycle.launch_environment import supervisor_environment
from sbxkit._protocol.wire import Message, Register
from sbxkit.engine.discovery import candidate_sockets
from sbxkit.errors import SbxError

ISOLATED_BOOT = (
    "import runpy, sys; module, root = sys.argv.pop(1), sys.argv.pop(1); "
    "sys.path.insert(0, root); runpy.run_module(module, run_name='__main__', alter_sys=True)"
)
"""The default supervisor's program, given the module (``sbxkit.supervisor``) and the
directory to import it from. It runs isolated (``python -I``: no ``PYTHONPATH``, no user site,
no current directory on the import path, whatever the caller's directory holds) and imports
sbxkit from where the caller's own sbxkit was imported."""


def sbxkit_root() -> str:
    """The directory the running sbxkit package was imported from (its parent's path)."""
    return str(Path(__file__).resolve().parents[2])


def supervisor_argv(
    state_dir: Path, command: str | None = None, *, engine_sockets: Sequence[str] = ()
) -> list[str]:
    """How to start the helper: ``command`` (a profile's ``supervisor.binary``), else
    ``SBXKIT_SUPERVISOR``, names an executable taking ``--state-dir`` (and ``--engine-socket``,
    the daemon socket the launching caller uses); the default is this interpreter, isolated,
    running the caller's own ``sbxkit.supervisor`` (``ISOLATED_BOOT``)."""
    override = (command if command is not None else os.environ.get("SBXKIT_SUPERVISOR", "")).strip()
    if override:
        base = shlex.split(override)
    else:
        base = [sys.executable, "-I", "-c", ISOLATED_BOOT, "sbxkit.supervisor", sbxkit_root()]
    sockets = [arg for socket in engine_sockets for arg in ("--engine-socket", socket)]
    return [*base, "--state-dir", str(state_dir), *sockets]


def launch_engine_sockets(first: Message | None) -> list[str]:
    """The daemon sockets a launched supervisor may serve: the registering caller's; for an
    operator's request (no Register), those the caller's environment names."""
    if isinstance(first, Register):
        return [first.engine_socket]
    try:
        return candidate_sockets(os.environ)
    except SbxError:
        return []


def launch_detached(argv: list[str], log_path: Path) -> None:
    """Start the supervisor in a new session whose parent is not us, so it survives us and we
    leave no zombie: a shell backgrounds it and exits at once. It gets a minimal environment
    (``environment.py``), never the caller's whole one, and starts in ``/``, never in the
    caller's directory (an untrusted checkout, a submission under test)."""
    subprocess.run(
        [
            "/bin/sh",
            "-c",
            'umask 077; unset PWD OLDPWD; log=$1; shift; "$@" </dev/null >/dev/null 2>>"$log" &',
            "sbxkit-launch",
            str(log_path),
            *argv,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
        check=True,
        timeout=10,
        env=supervisor_environment(os.environb),
    )


_LAUNCHING: trio.lowlevel.RunVar[dict[Path, trio.Lock]] = trio.lowlevel.RunVar("sbxkit_launch")


def launch_lock(state_dir: Path) -> trio.Lock:
    """One launch at a time per state directory in this trio run: the leases whose
    supervisor died all reconnect at once, and one new supervisor serves them all."""
    try:
        locks = _LAUNCHING.get()
    except LookupError:
        locks = {}
        _LAUNCHING.set(locks)
    return locks.setdefault(state_dir, trio.Lock())
