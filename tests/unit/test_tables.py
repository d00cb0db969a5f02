"""The operator tables (``sbxkit leases``, ``sbxkit pools``, ``sbxkit top``) to the character:
their columns are declared once (``sbxkit._util.table``), and the layout they had when each
wrote its widths twice, in the header and in the rows, is what they print."""

from __future__ import annotations

import time

import msgspec
import pytest

from sbxkit._lifecycle.leases_admin import format_pools, format_records
from sbxkit._model.result import Metrics
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import HeldPoolState
from sbxkit._util.table import Table
from sbxkit.cli.top import Row, format_table


def test_a_table_lays_out_header_and_cells_by_one_spec() -> None:
    table = Table(("NAME", "<6"), ("N", ">3"), ("WHAT", ""))
    assert table.header == "NAME      N  WHAT"
    assert table.line("ab", 7, "free text") == "ab        7  free text"
    assert table.line("toolong", 1234, "") == "toolong  1234  "  # a cell is never cut
    assert table.line("ab") == "ab    "  # the caller goes on from there


def record(letter: str, state: str, registered_at: float, **extra: str) -> LeaseRecord:
    fields = {
        "lease": letter * 32,
        "name": "n",
        "state": state,
        "engine_socket": "/s",
        "registered_at": registered_at,
        "lifetime_deadline": 2000.0,
        "memory_bytes": 1,
        "nano_cpus": 1,
        **extra,
    }
    return msgspec.convert(fields, LeaseRecord)


def test_the_leases_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    records = [
        record("a", "created", 958.4, container_id="c" * 64),
        record("b", "uncertain", -123456.0, reason="daemon gone"),
    ]
    assert format_records(records) == [
        "LEASE                             STATE      CONTAINER        AGE  REASON",
        f"{'a' * 32}  created    {'c' * 12}     42s  ",
        f"{'b' * 32}  uncertain  -             124456s  daemon gone",
    ]


def test_the_pools_table() -> None:
    pools = [
        HeldPoolState(
            shape="d" * 32, image="busybox", size=2, parked=1, starting=1, claimed=0,
            idle_s=12.4, idle_ttl_s=300.0,
        ),
        HeldPoolState(
            shape="e" * 32, image="python", size=10, parked=0, starting=0, claimed=3,
            idle_s=0.0, idle_ttl_s=1.5, problem="a full host",
        ),
    ]  # fmt: skip
    assert format_pools(pools) == [
        "SHAPE         SIZE  PARKED  STARTING  CLAIMED         IDLE  IMAGE",
        f"{'d' * 12}     2       1         1        0      12/300s  busybox",
        f"{'e' * 12}    10       0         0        3       0/1.5s  python"
        "  (last park failed: a full host)",
    ]


def test_the_top_table() -> None:
    metrics = Metrics(
        at=0.0, cgroup="v1", cpu_time_s=2.0, cpu_rate=0.25, memory_bytes=3 << 20,
        memory_peak_bytes=5 << 20, pids=2, io_read_bytes=0, io_write_bytes=1536,
    )  # fmt: skip
    rows = [
        Row(container_id="c" * 64, lease="a" * 32, name="sbxkit-one", metrics=metrics),
        Row(container_id="f" * 64, lease="b" * 32, name="sbxkit-two", error="pid 7: no"),
    ]
    assert format_table(rows) == [
        "CONTAINER     LEASE           CPU %   CPU TIME        MEM       PEAK   PIDS"
        "       READ      WRITE  NAME",
        f"{'c' * 12}  {'a' * 12}    25.0%      2.00s     3.0MiB     5.0MiB      2"
        "         0B     1.5KiB  sbxkit-one",
        f"{'f' * 12}  {'b' * 12}  pid 7: no  sbxkit-two",
    ]
