"""Operator commands: ``sbxkit leases list | recover | retire LEASE --confirm``."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from sbxkit.supervisor.client import SupervisorError, connect_supervisor, receive_reply
from sbxkit.supervisor.journal import StateDir, check_state_dir
from sbxkit.supervisor.records import LeaseRecord, StorageError
from sbxkit.supervisor.wire import Recover, Refused, Report, Retire


def read_journal(state_dir: Path) -> tuple[list[LeaseRecord], list[str]]:
    """Every readable record, and a line for each unsafe or malformed one (read-only)."""
    check_state_dir(state_dir, create=False)
    state = StateDir(state_dir)
    records: list[LeaseRecord] = []
    problems: list[str] = []
    for path in state.record_paths():
        try:
            records.append(state.read_record(path))
        except StorageError as exc:
            problems.append(str(exc))
    return records, problems


def format_records(records: list[LeaseRecord]) -> list[str]:
    now = time.time()
    lines = [f"{'LEASE':<32}  {'STATE':<9}  {'CONTAINER':<12}  {'AGE':>6}  REASON"]
    for r in records:
        lines.append(
            f"{r.lease:<32}  {r.state:<9}  {(r.container_id or '-')[:12]:<12}  "
            f"{now - r.registered_at:>5.0f}s  {r.reason or ''}"
        )
    return lines


async def request(state_dir: Path, message: Recover | Retire) -> Report:
    """Send an operator request to the state dir's supervisor (launched if absent)."""
    session = await connect_supervisor(state_dir)
    try:
        await session.send(message)
        reply = await receive_reply(session, type(message).__name__.lower(), timeout=120.0)
    finally:
        await session.aclose()
    if isinstance(reply, Refused):
        raise SupervisorError(reply.reason, code=reply.code)
    if not isinstance(reply, Report):
        raise SupervisorError(f"unexpected {type(reply).__name__}")
    return reply


def recover(state_dir: Path) -> Report:
    return trio.run(request, state_dir, Recover())


def retire(state_dir: Path, lease: str) -> Report:
    return trio.run(request, state_dir, Retire(lease=lease))
