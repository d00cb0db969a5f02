"""What the command line reads of ``sbxkit run``'s argv before handing it off (pure).

The grammar is the CLI's, parsed once, by the supervisor, with the CLI's own parser: this is
no second copy of it. The command line only needs three facts before it sends the argv — where
the payload's stdin comes from (it opens and feeds it itself), whether to print ``--json``, and
which variables ``--env NAME`` passes by name (it sends their values) — so it looks for those
words before the first ``--``. A guess that is wrong costs nothing but speed: the supervisor
declines the run unless its parse agrees (``Run.json``, ``Run.stdin``), and an ``--env`` name
missed here is unset there, which the parse refuses, so the full path runs it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing and dataclasses are not loaded here: each costs a few ms
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PLANNING_ENV", "Scan", "scan_run"]

PLANNING_ENV = (
    "SBXKIT_ENV",
    "SBXKIT_EVIDENCE",
    "SBXKIT_LABELS",
    "SBXKIT_NETWORK_AUDIT_LOG",
    "DOCKER_HOST",
    "XDG_RUNTIME_DIR",
    "HOME",
)
"""The caller's variables a run is judged under (``plan.effective_settings``) and that find
its daemon (``engine/discovery.py``): sent with every hand-off, when set."""

NOT_SERVED = (
    "--profile",
    "-h",
    "--help",
    "--env-file",
    "-v",
    "--volume",
    "--mount",
    "--output-encoding",
)
"""Options the hand-off never serves (a profile may name another supervisor or runtime; help
is the full parser's to print; a path the caller's working directory resolves; an output
encoding the command line would have to apply itself): the command line runs these itself
without asking."""


class Scan:
    """``--json`` given; ``--stdin``'s value; the names ``--env NAME`` passes by name; the
    daemon ``--socket`` names (its supervisor's state directory is that daemon's)."""

    def __init__(
        self,
        json: bool,
        stdin: str | None,
        env_names: tuple[str, ...],
        socket: str | None = None,
    ) -> None:
        self.json, self.stdin, self.env_names, self.socket = json, stdin, env_names, socket


def _not_text(word: str) -> bool:
    """A word that was not UTF-8 on the command line (Python keeps its bytes as surrogates)."""
    return any("\udc80" <= char <= "\udcff" for char in word)


def scan_run(argv: Sequence[str]) -> Scan | str:
    """The facts the hand-off needs, or why the command line runs ``argv`` itself."""
    if not argv or argv[0] != "run":
        return "not `sbxkit run`"
    if any(_not_text(word) for word in argv):
        return "an argument that is not UTF-8 (the full path names it)"
    words = list(argv[1:])
    options = words[: words.index("--")] if "--" in words else words
    json, stdin, env_names, socket = False, None, [], None
    for index, word in enumerate(options):
        name, eq, inline = word.partition("=")
        if name in NOT_SERVED:
            return f"{name} is not handed off"
        value = inline if eq else (options[index + 1] if index + 1 < len(options) else None)
        if word == "--json":
            json = True
        elif word in ("-i", "--interactive"):  # docker's habit: --stdin -
            stdin = "-"
        elif name == "--stdin" and value is not None:
            stdin = value
        elif name in ("--env", "-e") and value is not None and "=" not in value:
            env_names.append(value)
        elif name == "--socket" and value is not None:
            socket = value
    return Scan(json=json, stdin=stdin, env_names=tuple(env_names), socket=socket)
