"""The claim line: how a run's command and environment reach a parked shell (pure).

A parked container's main process is a shell waiting for exactly one line on its stdin
(``PARK_SCRIPT``). A claim writes one line, then the run's stdin byte-exact: the ``read``
builtin consumes exactly one line from a pipe (``sh -s`` would read ahead and eat the
payload's input). The line is::

    unset PWD OLDPWD SHLVL; K1='v1' K2='v2' ... exec 'argv0' 'argv1' ...

- Every word is shell-quoted; a word holding a newline or a carriage return rides spliced from
  quoted pieces and ``"$nl"``/``"$cr"``, which the parked shell defined before it read.
- The environment rides as assignments in front of ``exec``: the shell expands the command's
  words first and then the assignments left to right, so a spec key named ``nl`` or ``cr``
  (assigned last) never changes how another word is spliced.
- ``unset`` drops what the shell itself put in its environment (dash exports ``PWD``, busybox
  ash ``PWD`` and ``SHLVL``); the image's own values of those keys ride back as assignments, so
  the payload's environment is the cold run's.

What a claim line cannot carry exactly is served cold (``claim_line`` returns None): an env key
that is not a shell name (``A-B``, ``ÄKEY`` — the daemon takes them, ``export`` would not;
never parsed as shell), ``OPTIND`` (dash drops a value it cannot parse), a command the shell's
``exec`` would take for an option, and a line longer than ``MAX_CLAIM_LINE`` (the shell reads
it a byte at a time, and that time would count against the payload's time limit).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from sbxkit._kernel.scripts import SHELL_OWN_KEYS, shell_carries
from sbxkit._model.spec import SandboxSpec, root_inside
from sbxkit._plan.policy import claim_env

__all__ = [
    "MAX_CLAIM_LINE",
    "PARK_SCRIPT",
    "SHELL_OWN_KEYS",
    "claim_line",
    "claim_line_within",
    "claimable_key",
]

PARK_SCRIPT = "nl='\n' cr='\r'; IFS= read -r l && eval \"$l\""
"""The parked shell: one line, then that line is the payload (it ``exec``s the command). The
line cannot hold a newline or a carriage return: a word that has one is spliced from quoted
pieces and ``"$nl"``/``"$cr"``, which the shell defined before it read."""
MAX_CLAIM_LINE = 16 * 1024
"""Longer lines are served cold: read a byte at a time, 64 KiB cost busybox ash 37 ms here."""
_SPLICE = {"\n": '"$nl"', "\r": '"$cr"'}
_SPLICE_NAMES = {"nl": "\n", "cr": "\r"}


def _quote(word: str) -> str:
    """``word`` as one shell word on one line."""
    if "\n" not in word and "\r" not in word:
        return shlex.quote(word)
    pieces: list[str] = []
    current = ""
    for char in word:
        if char in _SPLICE:
            pieces += [shlex.quote(current), _SPLICE[char]]
            current = ""
        else:
            current += char
    pieces.append(shlex.quote(current))
    return "".join(pieces)


def claimable_key(key: str) -> bool:
    """An env key a claim line carries exactly: a shell name the parked shell leaves alone."""
    return shell_carries(key)


def _assignment_order(env: Mapping[str, str]) -> list[str] | None:
    """Keys in assignment order: the splice names last, so every other value is spliced with
    the parked shell's own; None when the two splice names need each other's values."""
    last = [key for key in ("cr", "nl") if key in env]
    if len(last) == 2:
        # The second assigned may not hold the first's splice character.
        if _SPLICE_NAMES["cr"] in env["nl"] and _SPLICE_NAMES["nl"] in env["cr"]:
            return None
        if _SPLICE_NAMES["cr"] in env["nl"]:
            last = ["nl", "cr"]
    return sorted(key for key in env if key not in last) + last


def claim_line(
    command: list[str], env: Mapping[str, str], *, image_env: Mapping[str, str] | None = None
) -> bytes | None:
    """The one line a claim writes, or None when the run must be served cold (see the module
    docstring). ``image_env`` is the image's own environment: its values of the keys the
    parked shell sets itself are put back."""
    restored = {k: v for k, v in (image_env or {}).items() if k in SHELL_OWN_KEYS}
    wanted = {**restored, **env}
    if any("\0" in word for word in [*command, *wanted, *wanted.values()]):
        return None
    if not command or command[0].startswith("-"):
        return None
    if not all(claimable_key(key) for key in wanted):
        return None
    order = _assignment_order(wanted)
    if order is None:
        return None
    assignments = "".join(f"{key}={_quote(wanted[key])} " for key in order)
    words = " ".join(_quote(word) for word in command)
    line = f"unset {' '.join(SHELL_OWN_KEYS)}; {assignments}exec {words}\n".encode()
    return line if len(line) <= MAX_CLAIM_LINE else None


def claim_line_within(
    spec: SandboxSpec, max_timeout_s: float, *, image_env: Mapping[str, str] | None = None
) -> bytes | None:
    """``spec``'s claim line, or None when a pool with this ``max_timeout_s`` serves it cold
    whatever it holds (no line, or a longer time limit)."""
    timeout_s = spec.limits.timeout_s
    if timeout_s is None or timeout_s > max_timeout_s or root_inside(spec):
        return None  # a workspace's root is proven as it starts: never parked, always cold
    return claim_line(list(spec.command), claim_env(spec), image_env=image_env)
