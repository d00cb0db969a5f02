"""How a payload that exited by a signal is reported: OOM-killed, killed by someone else, or
simply exited — decided only on evidence from the daemon, never on the exit status alone.

Exit status 137 only says SIGKILL: the kernel's OOM killer, an operator's ``docker kill``, a
daemon shutdown and the payload's own ``kill -9 $$`` or ``exit 137`` all produce it. The daemon
knows which: ``State.OOMKilled``, and its event log records an ``oom`` event (from the memory
cgroup's OOM notification, also when only a child was killed) and a ``kill`` event with the
signal for every kill sent through its API. sbxkit never sends a kill before it has judged an
exit, so a ``kill`` event there is someone else's.

The event log is a bounded ring in the daemon (256 events on Docker 20.10): on a very busy
daemon an old event can be gone, and the exit is then reported as ``exited`` with its status —
never as an OOM nobody saw.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Sequence
from datetime import datetime

from sbxkit.engine.client import Engine
from sbxkit.engine.models import Event
from sbxkit.result import Status

SIGNAL_EXIT_BASE = 128
_DOCKER_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")
EVENT_MARGIN_S = 1.0


def docker_time(text: str) -> float | None:
    """Unix seconds of a daemon timestamp (RFC 3339 with nanoseconds); None if unset/unreadable."""
    match = _DOCKER_TIME.fullmatch(text.strip())
    if match is None or text.startswith("0001-"):
        return None
    whole, fraction, zone = match.groups()
    zone = "+00:00" if zone == "Z" else zone
    stamp = datetime.fromisoformat(whole + zone).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)


def signal_number(text: str | None) -> int | None:
    """``"9"``, ``"KILL"`` or ``"SIGKILL"`` → 9 (the daemon's kill event spells it either way)."""
    if not text:
        return None
    if text.isdigit():
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        return None


def classify_exit(
    oom_flag: bool, exit_code: int | None, events: Sequence[Event] = ()
) -> tuple[Status, str | None]:
    """``(status, evidence)`` for a payload that ended by itself (not sbxkit's kill)."""
    if oom_flag:
        return "oom_killed", "State.OOMKilled"
    if exit_code is None or exit_code <= SIGNAL_EXIT_BASE:
        return "exited", None
    if any(event.action == "oom" for event in events):
        return "oom_killed", "the daemon's oom event for the container (OOMKilled unset)"
    signum = exit_code - SIGNAL_EXIT_BASE
    for event in events:
        attributes = event.actor.attributes or {}
        if event.action == "kill" and signal_number(attributes.get("signal")) == signum:
            name = signal.Signals(signum).name if signum in _SIGNALS else str(signum)
            return "killed", f"the daemon's kill event ({name}), not sent by sbxkit"
    return "exited", None


_SIGNALS = {int(s) for s in signal.Signals}


async def judge_exit(
    engine: Engine, container_id: str, exit_code: int | None
) -> tuple[Status, str | None]:
    """Inspect the container and, for a signal exit without the OOM flag, read the daemon's
    ``oom`` and ``kill`` events for it since it started."""
    state = (await engine.container_inspect(container_id)).state
    events: list[Event] = []
    if not state.oom_killed and exit_code is not None and exit_code > SIGNAL_EXIT_BASE:
        since = docker_time(state.started_at) or time.time() - 24 * 3600
        events = await engine.events_between(
            since - EVENT_MARGIN_S,
            time.time(),
            {"type": ["container"], "container": [container_id], "event": ["oom", "kill"]},
        )
    return classify_exit(state.oom_killed, exit_code, events)
