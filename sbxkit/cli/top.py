"""``sbxkit top``: every live sandbox of the supervisor with its CPU, memory, pids and I/O, as
its cgroup on the host counts them (sbxkit/_lifecycle/metrics.py), refreshed like ``docker
stats``.

The live sandboxes are the supervisor's journal's created leases (``sbxkit leases list``), read
again at every refresh: one opened since shows up, one removed drops out. A sandbox whose
cgroup this host cannot read keeps its line, with the reason instead of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from sbxkit._lifecycle.metrics import DEFAULT_INTERVAL_S, MetricsReader, check_interval
from sbxkit._model.result import Metrics
from sbxkit._protocol.records import LeaseRecord
from sbxkit._util.table import Table
from sbxkit.engine.client import Engine, connect
from sbxkit.errors import MetricsUnavailable, SbxError

__all__ = ["Row", "add_top_parser", "cmd_top", "format_json", "format_table"]


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One live sandbox as ``top`` shows it: its figures, or why there are none."""

    container_id: str
    lease: str
    name: str
    metrics: Metrics | None = None
    error: str | None = None


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value}B"


_TOP = Table(
    ("CONTAINER", "<12"),
    ("LEASE", "<12"),
    ("CPU %", ">7"),
    ("CPU TIME", ">9"),
    ("MEM", ">9"),
    ("PEAK", ">9"),
    ("PIDS", ">5"),
    ("READ", ">9"),
    ("WRITE", ">9"),
    ("NAME", ""),
)


def format_table(rows: Sequence[Row]) -> list[str]:
    """The rows as ``docker stats`` lays them out (pure); CPU % is of one core."""
    lines = [_TOP.header]
    for row in rows:
        ids = (row.container_id[:12], row.lease[:12])
        m = row.metrics
        if m is None:
            lines.append(f"{_TOP.line(*ids)}  {row.error or 'no reading'}  {row.name}")
            continue
        cpu = "-" if m.cpu_rate is None else f"{m.cpu_rate * 100:.1f}%"
        used = "-" if m.cpu_time_s is None else f"{m.cpu_time_s:.2f}s"
        pids = "-" if m.pids is None else str(m.pids)
        lines.append(
            _TOP.line(
                *ids,
                cpu,
                used,
                _size(m.memory_bytes),
                _size(m.memory_peak_bytes),
                pids,
                _size(m.io_read_bytes),
                _size(m.io_write_bytes),
                row.name,
            )
        )
    return lines


def format_json(rows: Sequence[Row]) -> list[str]:
    """One JSON object per sandbox (pure): its ids and name, ``metrics`` (``sbxkit.Metrics``'s
    fields) or ``error``."""
    return [json.dumps(msgspec.to_builtins(row), sort_keys=True) for row in rows]


def live_records(state_dir: Path) -> list[LeaseRecord]:
    """The journal's leases whose container exists (created), oldest first."""
    from sbxkit._lifecycle.leases_admin import read_journal

    if not os.path.lexists(state_dir):
        return []
    records, _problems = read_journal(state_dir)
    live = [r for r in records if r.state == "created" and r.container_id]
    return sorted(live, key=lambda r: r.registered_at)


class Watch:
    """The readers of the sandboxes seen so far, and the engines they were found through."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.engines: dict[str, Engine] = {}
        self.readers: dict[str, MetricsReader | str] = {}  # container id -> reader or why not

    async def refresh(self) -> list[Row]:
        """A reading of every live sandbox; a sandbox gone since drops out."""
        rows: list[Row] = []
        records = live_records(self.state_dir)
        for record in records:
            cid = record.container_id or ""
            base = Row(container_id=cid, lease=record.lease, name=record.name)
            reader = self.readers.get(cid)
            if reader is None:
                reader = self.readers[cid] = await self._open(record)
            if isinstance(reader, str):
                rows.append(msgspec.structs.replace(base, error=reader))
                continue
            try:
                sample = reader.read()
            except MetricsUnavailable as exc:
                self.readers[cid] = str(exc)
                rows.append(msgspec.structs.replace(base, error=str(exc)))
                continue
            if sample is not None:
                rows.append(msgspec.structs.replace(base, metrics=sample))
        known = {r.container_id for r in records}
        for cid in [c for c in self.readers if c not in known]:
            del self.readers[cid]
        return rows

    async def _open(self, record: LeaseRecord) -> MetricsReader | str:
        cid = record.container_id or ""
        try:
            engine = self.engines.get(record.engine_socket)
            if engine is None:
                engine = self.engines[record.engine_socket] = await connect(record.engine_socket)
            return await MetricsReader.open(engine, cid)
        except SbxError as exc:  # MetricsUnavailable included: the line says why
            return str(exc)

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()


async def top(state_dir: Path, interval_s: float, stream: bool, as_json: bool) -> int:
    watch = Watch(state_dir)
    clear = stream and not as_json and sys.stdout.isatty()
    try:
        await watch.refresh()  # a first reading, for the CPU rate over the interval
        while True:
            await trio.sleep(interval_s)
            rows = await watch.refresh()
            lines = format_json(rows) if as_json else format_table(rows)
            if clear:
                sys.stdout.write("\x1b[H\x1b[J")
            if lines:  # JSON for no sandbox is no line at all
                print("\n".join(lines), flush=True)
            if not stream:
                return 0
    finally:
        with trio.CancelScope(shield=True):
            await watch.aclose()


def cmd_top(args: argparse.Namespace) -> int:
    from sbxkit._protocol.journal import default_state_dir

    interval_s = check_interval(args.interval, "--interval")
    state_dir = args.state_dir or default_state_dir()
    try:
        return trio.run(top, state_dir, interval_s, not args.no_stream, args.format == "json")
    except KeyboardInterrupt:
        return 0


def add_top_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "top",
        help="every live sandbox of the supervisor with its CPU, memory, pids and I/O, refreshed",
        description="Live figures from each sandbox's cgroup on the host (like `docker stats`).",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="default: $SBXKIT_STATE_DIR or ~/.sbxkit/leases"
    )
    parser.add_argument("--no-stream", action="store_true", help="print one reading and exit")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"between readings (default {DEFAULT_INTERVAL_S:g}); CPU %% is over it",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(handler=cmd_top)
