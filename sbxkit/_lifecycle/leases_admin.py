"""Operator commands: ``sbxkit leases list | recover | retire LEASE --confirm`` and
``sbxkit pools list | end SHAPE | end --all``."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from sbxkit._lifecycle.connect import connect_supervisor, receive_reply
from sbxkit._protocol.journal import SOCKET_NAME, StateDir, check_state_dir
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import (
    EndPools,
    HeldPoolState,
    ListPools,
    Pools,
    Recover,
    Refused,
    Report,
    Retire,
)
from sbxkit._util.table import Table
from sbxkit.errors import StorageError, SupervisorError


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


_RECORDS = Table(
    ("LEASE", "<32"), ("STATE", "<9"), ("CONTAINER", "<12"), ("AGE", ">6"), ("REASON", "")
)
_POOLS = Table(
    ("SHAPE", "<12"),
    ("SIZE", ">4"),
    ("PARKED", ">6"),
    ("STARTING", ">8"),
    ("CLAIMED", ">7"),
    ("IDLE", ">11"),
    ("IMAGE", ""),
)


def format_records(records: list[LeaseRecord]) -> list[str]:
    now = time.time()
    lines = [_RECORDS.header]
    for r in records:
        age = f"{now - r.registered_at:.0f}s"
        lines.append(
            _RECORDS.line(r.lease, r.state, (r.container_id or "-")[:12], age, r.reason or "")
        )
    return lines


async def request(state_dir: Path, message: Recover | Retire) -> Report:
    """Send an operator request to the state dir's supervisor (launched if absent)."""
    reply = await _ask(state_dir, message)
    if not isinstance(reply, Report):
        raise SupervisorError(f"unexpected {type(reply).__name__}")
    return reply


async def _ask(state_dir: Path, message: Recover | Retire | ListPools | EndPools) -> object:
    session = await connect_supervisor(state_dir)
    try:
        await session.send(message)
        reply = await receive_reply(session, type(message).__name__.lower(), timeout=120.0)
    finally:
        await session.aclose()
    if isinstance(reply, Refused):
        raise SupervisorError(reply.reason, code=reply.code)
    return reply


async def pools_request(state_dir: Path, message: ListPools | EndPools) -> Pools:
    """``ListPools`` or ``EndPools`` to the state dir's supervisor. With no supervisor
    listening there, no pool is held, and none is launched only to say so."""
    if not (state_dir / SOCKET_NAME).exists():
        return Pools(pools=[])
    reply = await _ask(state_dir, message)
    if not isinstance(reply, Pools):
        raise SupervisorError(f"unexpected {type(reply).__name__}")
    return reply


def list_pools(state_dir: Path) -> Pools:
    return trio.run(pools_request, state_dir, ListPools())


def end_pools(state_dir: Path, shape: str | None) -> Pools:
    return trio.run(pools_request, state_dir, EndPools(shape=shape))


def format_pools(pools: list[HeldPoolState]) -> list[str]:
    """A table: one line per pool, its shape key shortened as ``end`` accepts it."""
    lines = [_POOLS.header]
    for p in pools:
        idle = f"{p.idle_s:.0f}/{p.idle_ttl_s:g}s"
        image = p.image + (f"  (last park failed: {p.problem})" if p.problem else "")
        lines.append(
            _POOLS.line(p.shape[:12], p.size, p.parked, p.starting, p.claimed, idle, image)
        )
    return lines


def recover(state_dir: Path) -> Report:
    return trio.run(request, state_dir, Recover())


def retire(state_dir: Path, lease: str) -> Report:
    return trio.run(request, state_dir, Retire(lease=lease))
