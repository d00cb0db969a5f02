"""The claim line: how a run's command and environment reach a parked shell (pure).

A parked container's main process is a shell waiting for exactly one line on its stdin
(``PARK_SCRIPT``). A claim writes one line — ``export K='v'; ...; exec 'argv0' 'argv1' ...``,
every word shell-quoted — followed by the run's stdin, byte-exact: the ``read`` builtin
consumes exactly one line from a pipe (``sh -s`` would read ahead and eat the payload's input,
pitfalls.md). A word holding a newline or a carriage return rides spliced from quoted pieces
and ``"$nl"``/``"$cr"``, which the shell defined before it read.
"""

from __future__ import annotations

import shlex

from sbxkit.spec import SandboxSpec

__all__ = ["PARK_SCRIPT", "claim_line", "claim_line_within"]

PARK_SCRIPT = "nl='\n' cr='\r'; IFS= read -r l && eval \"$l\""
"""The parked shell: one line, then that line is the payload (it ``exec``s the command). The
line cannot hold a newline or a carriage return: a word that has one is spliced from quoted
pieces and ``"$nl"``/``"$cr"``, which the shell defined before it read."""
_SPLICE = {"\n": '"$nl"', "\r": '"$cr"'}


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


def claim_line(command: list[str], env: dict[str, str]) -> bytes | None:
    """The one line a claim writes, or None when the run cannot be claimed this way (a NUL,
    which no argv or environment can hold, or a command the shell's ``exec`` would take for
    an option)."""
    if any("\0" in word for word in [*command, *env, *env.values()]):
        return None
    if not command or command[0].startswith("-"):
        return None
    exports = "".join(f"export {key}={_quote(value)}; " for key, value in sorted(env.items()))
    return (exports + "exec " + " ".join(_quote(word) for word in command) + "\n").encode()


def claim_line_within(spec: SandboxSpec, max_timeout_s: float) -> bytes | None:
    """``spec``'s claim line, or None when a pool with this ``max_timeout_s`` serves it cold
    whatever it holds (no line, or a longer time limit)."""
    timeout_s = spec.limits.timeout_s
    if timeout_s is None or timeout_s > max_timeout_s:
        return None
    return claim_line(list(spec.command), dict(spec.env))
