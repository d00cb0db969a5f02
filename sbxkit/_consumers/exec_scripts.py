"""The shell scripts a session's execs run inside the sandbox (pure constants).

``RUN_SCRIPT`` wraps every exec so its process group can be killed (the Engine API cannot kill an
exec, moby #9167); ``KILL_SCRIPT`` is that kill; ``PUT_SCRIPT`` and ``GET_SCRIPT`` move files with
``tar``, confined by the resolved path, and ``PUT_DIR_SCRIPT``/``GET_DIR_SCRIPT`` whole directories.
sbxkit/_consumers/session.py explains how they are used.
"""

from __future__ import annotations

from collections.abc import Sequence

from sbxkit._plan.policy import SCRATCH_PATH
from sbxkit.engine.execapi import ExecCreate

__all__ = [
    "EXEC_FILE",
    "GET_DIR_SCRIPT",
    "GET_SCRIPT",
    "KILL_SCRIPT",
    "MISSING_STATUS",
    "NO_GROUP_STATUS",
    "PUT_DIR_SCRIPT",
    "PUT_SCRIPT",
    "RUN_SCRIPT",
    "SIGNAL_SCRIPT",
    "wrapped_exec",
]

EXEC_FILE = SCRATCH_PATH + "/.sbxkit-exec-"
"""Prefix of each exec's group-id record (``.pid``)."""

RUN_SCRIPT = (
    f"f={EXEC_FILE}$1; shift; "
    "setsid sh -c '"
    'echo $$ >"$1.pid" || { echo "sbxkit: cannot record the process group of $2 in '
    + SCRATCH_PATH
    + ' (is it full?)" >&2; exit 126; }; '
    "shift; "
    'command -v "$1" >/dev/null || { echo "sbxkit: $1: command not found" >&2; exit 127; }; '
    'exec "$@"'
    '\' sbxkit "$f" "$@"; '
    "s=$?; "
    'p=; { read -r p <"$f.pid"; } 2>/dev/null; '
    'case "$p" in ""|*[!0-9]*) ;; *) kill -0 -$p 2>/dev/null && exit $s;; esac; '
    'rm -f "$f.pid"; '
    "exit $s"
)
"""The exec wrapper. ``$1`` is the exec's token, the rest is the command. The outer ``sh`` is
the exec's main process and forks ``setsid``, which (not being a group leader) makes the inner
``sh`` the leader of a new session and group without forking; the inner ``sh`` records its pid
(= the group id) and becomes the command. The inner ``sh`` is named ``sbxkit`` (its ``$0``, the
name its errors carry), and a command it cannot find is said as ``sbxkit: CMD: command not
found`` (127, as a shell says it) — never with the record's path. The outer ``sh`` returns the
command's status and removes the record — unless the group outlived its leader (background
children): then the record stays, so a timeout that comes while they hold the exec's output
open still finds and kills them. Nothing the wrapper reads can stop the command: a file in the
scratch space is the payload's to write, and an earlier exec's process could forge it."""

KILL_SCRIPT = (
    f"f={EXEC_FILE}$1; "
    'g() { p=; { read -r p <"$f.pid"; } 2>/dev/null; '
    'case "$p" in ""|*[!0-9]*) return 0;; esac; '
    '[ "$p" -gt 1 ] && kill -KILL -$p 2>/dev/null; return 0; }; '
    "g; "
    "for d in /proc/[0-9]*; do "
    'c=$(tr "\\000" " " <"$d/cmdline" 2>/dev/null) || continue; '
    'case "$c" in *"sbxkit-exec $1 "*|*".sbxkit-exec-$1 "*) kill -KILL "${d#/proc/}" 2>/dev/null;; '
    "esac; done; "
    "g; "
    'rm -f "$f.pid"; '
    "exit 0"
)
"""The killer. Kills the recorded group (a number greater than 1: the sandbox user could write
anything there) without forking — a fork bomb in it may hold every pid — then every process
that still carries this exec's token in its arguments (the wrapper before it recorded its
group: the outer ``sh``, ``setsid``, the inner ``sh``), then the recorded group once more (a
wrapper that recorded it meanwhile has ``exec``'d the command as that group's leader). So an
exec ended before it recorded its group never starts its command, with no marker a payload
could plant. ``kill -KILL -N`` is the spelling both busybox ``sh`` and Debian's ``dash`` accept
(``kill -KILL -- -N`` is not)."""

NO_GROUP_STATUS = 3
"""``SIGNAL_SCRIPT``'s exit status when no live group is recorded for the token (yet)."""
SIGNAL_SCRIPT = (
    f"f={EXEC_FILE}$1; "
    'p=; { read -r p <"$f.pid"; } 2>/dev/null; '
    'case "$p" in ""|*[!0-9]*) exit 3;; esac; '
    '[ "$p" -gt 1 ] || exit 3; '
    "kill -$2 -$p 2>/dev/null || exit 3; "
    "exit 0"
)
"""Sends signal number ``$2`` to the group recorded for token ``$1`` (a background process,
sbxkit/_consumers/processes.py). Exits ``NO_GROUP_STATUS`` when the wrapper has not recorded
its group yet, or the group is gone: the caller retries briefly, knowing whether it ended."""

# Confinement by the resolved path: a link the payload planted on the way (``/tmp/job -> /etc``)
# is refused unless where it leads stays under the file root, which must be no link itself.
_ROOT = 'cd "$1" || exit 125; r=$(pwd -P); [ "$r" = "$1" ] || { p=$1; a=$r; _out; }; shift; '
_OUT = '_out() { echo "sbxkit: $p leads to $a, outside the file root" >&2; exit 125; }; '
PUT_SCRIPT = (
    _OUT
    + _ROOT
    + 'd=$1; n=$2; shift 2; i=0; for p in "$@"; do i=$((i + 1)); '
    + '[ -L "$p" ] && { echo "sbxkit: $p is a link; none is written through" >&2; exit 125; }; '
    + 'if [ "$i" -le "$n" ]; then [ ! -e "$p" ] || [ -d "$p" ] || { '
    + 'echo "sbxkit: $p is a file, not a directory; nothing is written over it" >&2; exit 125; }; '
    + 'elif [ -d "$p" ]; then '
    + 'echo "sbxkit: $p is a directory; no file is written over it" >&2; exit 125; fi; done; '
    + 'mkdir -p "$d" || exit 1; i=0; for p in "$@"; do i=$((i + 1)); '
    + '[ "$i" -le "$n" ] && { mkdir -p "$p" || exit 1; }; done; '
    + 'exec tar -x -m -f - -C "$d"'
)
"""``$1`` the file root, ``$2`` the destination, ``$3`` how many directories follow: every
directory on the way to the destination and in the archive's names, then every file the
archive names, all relative to the root. None may be a link already (``mkdir -p`` and tar would
write through it), a directory may not be a file nor a file a directory (tar would replace
it). Missing directories are made with ``mkdir -p``; existing ones keep their modes."""
MISSING_STATUS = 3
"""``GET_SCRIPT``'s exit status for a file that is not there (its name on stderr); tar's own
are 1 and 2."""
GET_SCRIPT = (
    _OUT
    + _ROOT
    + '_no() { printf "%s\\n" "$p" >&2; exit 3; }; '
    + 'for p in "$@"; do a=$(cd "${p%/*}" 2>/dev/null && pwd -P) || { '
    + '[ -e "${p%/*}" ] || _no; continue; }; '
    + 'case "$a/" in "${r%/}"/*) ;; *) _out;; esac; '
    + '[ -e "$p" ] || [ -L "$p" ] || _no; done; '
    + 'exec tar -c -f - "$@"'
)
"""``$1`` the file root, the rest the files (``./``-relative): each one's directory must resolve
under the root (tar follows links on the way; a link at the end it archives as a link, which
the parser refuses). A file that is not there — or whose directory is not — ends it with
``MISSING_STATUS`` and its name, checked after its directory is known to be under the root
(so nothing is said about places outside it)."""

_UNDER = 'case "$a/" in "${r%/}"/*) ;; *) _out;; esac; '
PUT_DIR_SCRIPT = (
    _OUT
    + _ROOT
    + 'd=$1; shift; for p in "$@"; do '
    + '[ -L "$p" ] && { echo "sbxkit: $p is a link; none is written through" >&2; exit 125; }; '
    + "done; "
    + 'mkdir -p "$d" && cd "$d" || exit 125; p=$d; a=$(pwd -P); '
    + _UNDER
    + "l=$(find . -type l | head -n 1); "
    + '[ -z "$l" ] || { echo "sbxkit: $d/${l#./} is a link; none is written through" >&2; '
    + "exit 125; }; "
    + "exec tar -x -m -f -"
)
"""``$1`` the file root, ``$2`` the destination, the rest every directory on the way to it,
relative to the root: none may be a link, the destination must resolve under the root, and
no link may be anywhere under it already (tar would write through one) — checked before the
stream is read. Entries the stream names that exist already are replaced, as tar does."""
GET_DIR_SCRIPT = (
    _OUT
    + _ROOT
    + '_no() { printf "%s\\n" "$p" >&2; exit 3; }; '
    + 'p=$1; if cd "$p" 2>/dev/null; then a=$(pwd -P); '
    + _UNDER
    + "exec tar -c -f - .; fi; "
    + 'a=$(cd "${p%/*}" 2>/dev/null && pwd -P) || _no; '
    + _UNDER
    + '[ -e "$p" ] || [ -L "$p" ] || _no; '
    + 'echo "sbxkit: $p is not a directory" >&2; exit 125'
)
"""``$1`` the file root, ``$2`` the directory (``./``-relative): it must resolve under the root
(a link to a place inside it is followed, as ``get_files`` does); its tree is archived as
``./…`` without following links in it (the reader refuses them). A directory that is not
there ends it with ``MISSING_STATUS`` and its name, said only once its parent is known to be
under the root."""


def wrapped_exec(
    token: str,
    argv: Sequence[str],
    *,
    user: str,
    stdin: bool,
    tty: bool = False,
    env: list[str] | None = None,
    workdir: str | None = None,
) -> ExecCreate:
    """The exec of ``argv`` under ``RUN_SCRIPT``: its own process group, recorded under
    ``token`` for the killer; never privileged, always as the sandbox's user."""
    return ExecCreate(
        cmd=["sh", "-c", RUN_SCRIPT, "sbxkit-exec", token, *argv],
        attach_stdin=stdin,
        attach_stdout=True,
        attach_stderr=True,
        tty=tty,
        privileged=False,
        user=user,
        env=env,
        working_dir=workdir,
    )
