"""A cold run's gate: the payload waits for one line until its network is governed.

A governed sandbox's listeners can only be bound once its container runs (there is no network
namespace to enter before), and they must exist before its payload runs. So a cold one-shot
run of a governed spec starts a shell that blocks in ``read`` on its stdin::

    sh -c 'IFS= read -r _ && exec "$0" "$@"' CMD ARG...

The owner installs the listeners (governor.py), then sbxkit writes one newline, then the run's
own stdin (``Prefixed``): ``read`` consumes exactly that line from the pipe (a shell's
``read`` does not read ahead on a pipe; ``sh -s`` would) and the command replaces the shell,
byte-exact stdin and all. The command travels as argv in the create body, never quoted into a
line, so nothing here depends on how a pool's claim is carried; it is the pool's parked shell
reduced to a gate. The image needs ``/bin/sh``, as a pool's does. The same gate holds a
payload while a workspace's root is proven not the host's, and on rootless Podman while the
host sets the rlimits the engine dropped (``sbxkit._kernel.rlimits``).
"""

from __future__ import annotations

from sbxkit._util.stdin import Prefixed
from sbxkit.errors import SpecError

__all__ = ["GATE_LINE", "GATE_SCRIPT", "Prefixed", "gate_command"]

GATE_SCRIPT = 'IFS= read -r _ && exec "$0" "$@"'
GATE_LINE = b"\n"


GOVERNED = "under a governed network the command starts after the network is in place"


def gate_command(command: list[str], why: str = GOVERNED) -> list[str]:
    """The gated form of ``command`` (refused when the shell's ``exec`` would read its first
    word as an option; ``why`` it is gated)."""
    if not command or command[0].startswith("-"):
        raise SpecError(
            "command[0]",
            f"{why}, through the shell's exec, which would take a leading '-' for an option",
        )
    return ["sh", "-c", GATE_SCRIPT, *command]
