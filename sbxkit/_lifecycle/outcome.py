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
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

import msgspec
import trio

from sbxkit._model.result import Status
from sbxkit._protocol.wire import Expiring
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerState, Event
from sbxkit.errors import NotFound

SIGNAL_EXIT_BASE = 128
_DOCKER_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")
EVENT_MARGIN_S = 1.0
EVIDENCE_GRACE_S = 1.0
"""How long, at least, a signal exit that nothing explains yet waits for the daemon's evidence:
its ``oom`` event (and ``OOMKilled``) can be handled after the exit itself — the shim watches
the memory cgroup and reaps the process in two goroutines — and was once, under CI's load, with
gVisor on Docker 26.1."""
EVIDENCE_GRACE_ROUND_TRIPS = 50
"""... and at least this many of the daemon's round trips, as the judging's own inspection
measured it: where the daemon answers slowly (an emulated CPU, a loaded host) its event handling
is slow alike (under a 17x slower VM the ``oom`` of rootless Docker once came after 1 s)."""
EVIDENCE_GRACE_MAX_S = 10.0
"""... and never longer than this: an unexplained signal exit must not wait on a daemon that
hangs."""
EVIDENCE_POLL_S = 0.1


def evidence_grace(round_trip_s: float) -> float:
    """How long a signal exit nothing explains waits for evidence, after a daemon round trip
    of ``round_trip_s``."""
    scaled = EVIDENCE_GRACE_ROUND_TRIPS * max(0.0, round_trip_s)
    return min(EVIDENCE_GRACE_MAX_S, max(EVIDENCE_GRACE_S, scaled))


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


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """How a process ended, as far as the evidence goes.

    ``status`` is ``exited`` unless evidence proves an OOM kill (``oom_killed``) or someone
    else's kill (``killed``) of the process itself. ``oom_evidence`` names the evidence of an
    OOM kill in the sandbox; on an ``exited`` verdict it says that another process of the
    sandbox (a child) was OOM-killed while the payload exited by itself.
    """

    status: Status
    oom_evidence: str | None = None
    kill_evidence: str | None = None


EXITED = Verdict(status="exited")


def classify_exit(oom_flag: bool, exit_code: int | None, events: Sequence[Event] = ()) -> Verdict:
    """The verdict for a process that ended by itself (not by sbxkit's kill).

    An exit status of 128 or less is the process's own answer and stands, whatever else the
    sandbox's memory cgroup saw: an OOM kill of a child is noted, never reported as the
    payload's. A signal exit is ``oom_killed`` on the flag or an ``oom`` event, ``killed`` on a
    ``kill`` event with that signal, and otherwise ``exited`` with its status.
    """
    oom = "State.OOMKilled" if oom_flag else None
    if oom is None and any(event.action == "oom" for event in events):
        oom = "the daemon's oom event for the container (OOMKilled unset)"
    if exit_code is None or exit_code <= SIGNAL_EXIT_BASE:
        if oom is None:
            return EXITED
        note = f"{oom}: a process in the sandbox was OOM-killed; the payload exited "
        return Verdict(status="exited", oom_evidence=note + f"{exit_code} by itself")
    if oom is not None:
        return Verdict(status="oom_killed", oom_evidence=oom)
    signum = exit_code - SIGNAL_EXIT_BASE
    for event in events:
        attributes = event.actor.attributes or {}
        if event.action == "kill" and signal_number(attributes.get("signal")) == signum:
            name = signal.Signals(signum).name if signum in _SIGNALS else str(signum)
            evidence = f"the daemon's kill event ({name}), not sent by sbxkit"
            return Verdict(status="killed", kill_evidence=evidence)
    return EXITED


_SIGNALS = {int(s) for s in signal.Signals}


OwnerReason = Callable[[], Awaitable[Expiring | None]]
"""Why the owner itself ended the container (``Owner.ended_by_owner``), if it did."""


async def judge_exit(
    engine: Engine,
    container_id: str,
    exit_code: int | None,
    *,
    since: float | None = None,
    ended_by_owner: OwnerReason | None = None,
) -> Verdict:
    """Inspect the container and, for a signal exit without the flag, read the daemon's
    ``oom`` and ``kill`` events for it.

    For the container's own process (``since`` None) the window is the container's life and
    ``State.OOMKilled`` counts. For an exec (``since`` = when it was created, unix seconds) only
    events from then on count, and not the flag: it stays set for the rest of a session once any
    process in it was OOM-killed, so it cannot say whether this exec's process was.

    A container already removed (its owner's removal can win the race with a kernel path
    run's judging) has no flag to read: its events, which outlive it, and its owner decide.
    """
    own_process = since is None
    asked = trio.current_time()
    state = await _state_if_any(engine, container_id)
    round_trip = trio.current_time() - asked
    oom_flag = state.oom_killed if own_process and state is not None else False
    if since is None:
        started = docker_time(state.started_at) if state is not None else None
        since = (started or time.time() - 24 * 3600) - EVENT_MARGIN_S
    events: list[Event] = []
    signalled = exit_code is not None and exit_code > SIGNAL_EXIT_BASE
    if signalled and not oom_flag and ended_by_owner is not None:
        ending = await ended_by_owner()
        if ending is not None:  # sbxkit's own removal, never someone else's kill
            why = f"sbxkit's own removal: {ending.reason}"
            return Verdict(status=ending.status, kill_evidence=why)
    # An exit of its own (<= 128) stands: only a signal exit is worth the events call.
    if oom_flag or not signalled:
        return classify_exit(oom_flag, exit_code, events)
    evidence = {"type": ["container"], "container": [container_id], "event": ["oom", "kill"]}
    deadline = trio.current_time() + evidence_grace(round_trip)
    while not (events := await engine.events_between(since, time.time(), evidence)):
        if trio.current_time() >= deadline:
            break
        await trio.sleep(EVIDENCE_POLL_S)
        if not own_process:  # an exec's verdict never reads the flag: no inspect to make
            continue
        state = await _state_if_any(engine, container_id)
        if state is not None and state.oom_killed:
            oom_flag = True
            break
    return classify_exit(oom_flag, exit_code, events)


async def _state_if_any(engine: Engine, container_id: str) -> ContainerState | None:
    """The container's state, or None once it was removed."""
    try:
        return (await engine.container_inspect(container_id)).state
    except NotFound:
        return None
