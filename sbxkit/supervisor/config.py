"""The supervisor's configuration: its bounds, its admission budget and its command line.

Hard bounds (records, connections) fail explicitly when used up. The admission budget (memory,
live sandboxes, an optional CPU budget) and the launch bound (creates and starts in flight)
make a request wait its turn instead; see ``admission.py`` and docs/operations.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from sbxkit._model.units import parse_duration, parse_size
from sbxkit._util.argtypes import positive_float, positive_int
from sbxkit.errors import SpecError

ADMISSION_TIMEOUT_S = 3600.0
"""How long a request may wait for capacity by default: a batch of thousands at any sane
parallelism waits far less; a request that waits an hour is stuck behind something."""
MAX_STARTUP_DEADLINE_S = 60.0
"""The longest startup deadline a caller gets, whatever it asks: how long one lease may hold a
launch slot without saying it started (the client asks 30 s; a create and a start take well
under a second here). A client asking more cannot keep every slot from the others."""
ADOPT_GRACE_S = 10.0
"""How long a restarted supervisor holds a live container of an intact record for its caller
to re-adopt (issue 22) before it is an orphan: a caller notices the drop at once and launches
a supervisor in about a second here; ten leave room for a loaded host."""


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    """Hard bounds (exhaustion refuses with "capacity") and the admission budget (waits)."""

    max_records: int = 512  # hard: lease records in the journal, tombstones included
    max_connections: int = 256  # hard: client connections, queued callers included
    max_workers: int = 64  # admission: live sandboxes; one more waits
    memory_budget_bytes: int | None = None  # admission; None: MemTotal less a headroom
    cpu_budget_nano: int | None = None  # admission; None: CPU quotas do not limit admission
    max_launching: int | None = None  # creates + starts in flight; None: twice the daemon's NCPU
    admission_timeout_s: float = ADMISSION_TIMEOUT_S
    max_startup_deadline_s: float = MAX_STARTUP_DEADLINE_S


class Config(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: Path
    persistent: bool = False
    idle_exit_s: float = 10.0
    reaper_interval_s: float = 2.0
    capacity: Capacity = Capacity()
    docker_socket: str | None = None  # reach the daemon through this socket, whatever callers say
    adopt_grace_s: float = ADOPT_GRACE_S
    """At startup, a live container of an intact record waits this long for its caller to
    re-adopt the lease (``Adopt``) before recovery removes it; 0: recovery removes at once."""
    engine_sockets: tuple[str, ...] = ()
    """The daemon sockets callers may name (``--engine-socket``, repeatable; the auto-launching
    client passes its own). Empty: the one its start environment names (``DOCKER_HOST``, else
    the standard places). Any other is refused: the supervisor talks to no socket a client
    merely names."""


def launch_bound(capacity: Capacity, ncpu: int) -> int:
    """Creates and starts in flight: what loads the daemon, so derived from its CPU count."""
    if capacity.max_launching is not None:
        return capacity.max_launching
    return max(2, 2 * ncpu)


def size_bytes(text: str) -> int:
    """A size flag (``8g``, ``512MiB``, bytes when bare), read as every sbxkit size is."""
    try:
        value = parse_size(text, "size")
    except SpecError as exc:
        raise argparse.ArgumentTypeError(exc.rule) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def _duration(text: str, *, zero: bool) -> float:
    """A duration flag (``10``, ``500ms``, ``5m``), read as every sbxkit duration is: finite,
    above 0 (or at least 0 where ``zero`` turns something off)."""
    try:
        value = parse_duration(text, "duration")
    except SpecError as exc:
        raise argparse.ArgumentTypeError(exc.rule) from None
    if not ((value >= 0 if zero else value > 0) and value != float("inf")):  # refuses NaN too
        bound = ">= 0" if zero else "> 0"
        raise argparse.ArgumentTypeError(f"must be a finite duration {bound}, got {text!r}")
    return value


def cpu_nanos(text: str) -> int:
    """A CPU count flag (``1.5``) above 0, in the nano-CPUs the daemon counts."""
    return round(positive_float(text) * 1e9)


def duration_s(text: str) -> float:
    """A duration flag (``10``, ``500ms``, ``5m``) above 0."""
    return _duration(text, zero=False)


def grace_s(text: str) -> float:
    """A duration flag that may be 0 (``--adopt-grace 0`` turns the hold off)."""
    return _duration(text, zero=True)


def build_parser(prog: str = "sbxkit supervisor") -> argparse.ArgumentParser:
    defaults = Capacity()
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog,
        description="Own sandbox creation and cleanup through a durable lease journal.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="absolute private directory (default: $SBXKIT_STATE_DIR or ~/.sbxkit/leases)",
    )
    parser.add_argument(
        "--persistent", action="store_true", help="stay up while idle (for a service manager)"
    )
    parser.add_argument(
        "--idle-exit",
        type=duration_s,
        default=10.0,
        metavar="DURATION",
        help="exit after this long idle and record-free: 10, 500ms, 5m (default: 10 s)",
    )
    parser.add_argument(
        "--reaper-interval",
        type=duration_s,
        default=2.0,
        metavar="DURATION",
        help="how often records no live lease owns are checked (default: 2 s)",
    )
    parser.add_argument(
        "--docker-socket",
        metavar="PATH",
        help="reach the daemon through this socket instead of the caller's "
        "(a local relay, or to pin one daemon)",
    )
    parser.add_argument(
        "--engine-socket",
        metavar="PATH",
        action="append",
        default=[],
        help="a daemon socket callers may name (repeatable; default: $DOCKER_HOST, else the "
        "standard sockets); any other is refused",
    )
    parser.add_argument(
        "--max-workers",
        type=positive_int,
        default=defaults.max_workers,
        help=f"live sandboxes at once; more wait their turn (default: {defaults.max_workers})",
    )
    parser.add_argument(
        "--max-records",
        type=positive_int,
        default=defaults.max_records,
        help=f"lease records; more are refused (default: {defaults.max_records})",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=defaults.max_connections,
        help=(
            "client connections; at the cap the one longest in its handshake is dropped, "
            f"else a newcomer is refused (default: {defaults.max_connections})"
        ),
    )
    parser.add_argument(
        "--memory-budget",
        dest="memory_budget_bytes",
        type=size_bytes,
        default=None,
        metavar="SIZE",
        help="memory the sandboxes may reserve at once: 8g, bytes when bare (default: the "
        "daemon's MemTotal less the larger of 1 GiB and 10%%)",
    )
    parser.add_argument(
        "--cpu-budget",
        dest="cpu_budget_nano",
        type=cpu_nanos,
        default=None,
        metavar="CPUS",
        help="CPUs the sandboxes' quotas may add up to (default: none; quotas are ceilings)",
    )
    parser.add_argument(
        "--max-launching",
        type=positive_int,
        default=None,
        metavar="N",
        help="creates and starts in flight at once (default: twice the daemon's NCPU)",
    )
    parser.add_argument(
        "--admission-timeout",
        dest="admission_timeout_s",
        type=duration_s,
        default=ADMISSION_TIMEOUT_S,
        metavar="DURATION",
        help=f"how long a request may wait for capacity (default: {ADMISSION_TIMEOUT_S:g} s)",
    )
    parser.add_argument(
        "--max-startup-deadline",
        dest="max_startup_deadline_s",
        type=duration_s,
        default=MAX_STARTUP_DEADLINE_S,
        metavar="DURATION",
        help="the longest a lease may hold a launch slot before its caller says it started; a "
        f"longer startup deadline asked for is cut to this (default: {MAX_STARTUP_DEADLINE_S:g} s)",
    )
    parser.add_argument(
        "--adopt-grace",
        type=grace_s,
        default=ADOPT_GRACE_S,
        metavar="DURATION",
        help="at startup, how long a live container of an intact record waits for its caller "
        f"to re-adopt it before it is an orphan; 0: none (default: {ADOPT_GRACE_S:g} s)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    from sbxkit._protocol.journal import default_state_dir

    return Config(
        state_dir=args.state_dir or default_state_dir(),
        persistent=args.persistent,
        idle_exit_s=args.idle_exit,
        reaper_interval_s=args.reaper_interval,
        # build_parser's capacity flags are stored under Capacity's own field names
        capacity=Capacity(**{name: getattr(args, name) for name in Capacity.__struct_fields__}),
        docker_socket=args.docker_socket,
        adopt_grace_s=args.adopt_grace,
        engine_sockets=tuple(args.engine_socket),
    )


__all__ = [
    "ADMISSION_TIMEOUT_S",
    "ADOPT_GRACE_S",
    "MAX_STARTUP_DEADLINE_S",
    "Capacity",
    "Config",
    "build_parser",
    "config_from_args",
]
