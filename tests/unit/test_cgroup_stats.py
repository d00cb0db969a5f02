"""The cgroup counters' parsers (sbxkit/_kernel/cgroup_stats.py), the CPU rate and ``sbxkit
top``'s layouts, on the files as kernels write them.

The v1 samples were read on this project's v1 host from a sandbox's cgroup (a python payload
holding 50 MiB); its kernel accounts no block I/O there (every ``blkio.throttle.*`` file reads
``Total 0``), so the device lines of ``V1_BLKIO`` follow the kernel's layout
(``blkcg_print_stat``) instead. The v2 samples were read in the cgroup v2 VM cell
(scripts/cgroup2-cell: Debian's kernel 7.2, dockerd with the systemd driver) by
tests/engine/test_metrics.py's ``print_raw_files``, while a payload held 100 MiB; its
``io.stat`` was empty (no block device I/O), so ``V2_IO_STAT``'s lines follow the kernel's
nested keyed layout (Documentation/admin-guide/cgroup-v2.rst).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sbxkit._kernel.cgroup_stats import (
    CgroupPlaces,
    cgroup_places,
    parse_blkio_v1,
    parse_counter,
    parse_io_stat_v2,
    parse_keyed,
    read_cgroups,
    read_sample,
)
from sbxkit._lifecycle.metrics import check_interval, with_rate
from sbxkit._model.result import Metrics
from sbxkit.cli.top import Row, format_json, format_table
from sbxkit.errors import SpecError

CID = "7465f5a402d5f44f6ddb406b1f9cc1aa48a3847dfd196131336367a422f96ca8"
V1_PROC_CGROUP = f"""\
10:hugetlb:/docker/{CID}
9:name=systemd:/docker/{CID}
8:pids:/docker/{CID}
7:blkio:/docker/{CID}
6:freezer:/docker/{CID}
5:devices:/docker/{CID}
4:memory:/docker/{CID}
3:cpuset:/docker/{CID}
2:cpuacct:/docker/{CID}
1:cpu:/docker/{CID}
0::/docker/{CID}
"""
V1_FILES = {
    "memory.usage_in_bytes": "108662784\n",
    "memory.max_usage_in_bytes": "108818432\n",
    "cpuacct.usage": "69470402\n",
    "pids.current": "4\n",
    "blkio.throttle.io_service_bytes_recursive": "Total 0\n",
}
V1_BLKIO = """\
254:0 Read 1159168
254:0 Write 8192
254:0 Sync 1167360
254:0 Async 0
254:0 Discard 0
254:0 Total 1167360
7:1 Read 4096
7:1 Write 0
7:1 Sync 4096
7:1 Async 0
7:1 Discard 0
7:1 Total 4096
Total 1171456
"""
V2_PROC_CGROUP = f"0::/system.slice/docker-{CID}.scope\n"
V2_FILES = {
    "memory.current": "108560384\n",
    "memory.peak": "108560384\n",
    "cpu.stat": (
        "usage_usec 5022322\nuser_usec 2765021\nsystem_usec 2257300\nnice_usec 0\n"
        "nr_periods 64\nnr_throttled 23\nthrottled_usec 385778\nnr_bursts 0\nburst_usec 0\n"
    ),
    "pids.current": "4\n",
    "io.stat": "",
}
V2_IO_STAT = "254:0 rbytes=5369856 wbytes=4096 rios=121 wios=1 dbytes=0 dios=0\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_v1_places_from_a_hybrid_hosts_proc_cgroup() -> None:
    places = cgroup_places(V1_PROC_CGROUP, root="/cg")
    assert places == CgroupPlaces(
        "v1",
        memory=f"/cg/memory/docker/{CID}",
        cpu=f"/cg/cpuacct/docker/{CID}",
        pids=f"/cg/pids/docker/{CID}",
        io=f"/cg/blkio/docker/{CID}",
    )


def test_v1_places_with_comounted_controllers() -> None:
    text = f"4:memory:/docker/{CID}\n3:cpu,cpuacct:/docker/{CID}\n"
    places = cgroup_places(text, root="/cg")
    assert places is not None
    assert places.cpu == f"/cg/cpu,cpuacct/docker/{CID}"
    assert places.pids is None  # not named: no pids figure, not a guess


def test_v2_places_and_none_for_neither() -> None:
    places = cgroup_places(V2_PROC_CGROUP, root="/cg")
    directory = f"/cg/system.slice/docker-{CID}.scope"
    assert places == CgroupPlaces("v2", directory, directory, directory, directory)
    assert cgroup_places("1:name=systemd:/x\n") is None
    assert cgroup_places("") is None


def test_the_parsers() -> None:
    assert parse_counter("108662784\n") == 108662784
    assert parse_counter("max\n") is None
    assert parse_counter("") is None
    assert parse_keyed(V2_FILES["cpu.stat"])["usage_usec"] == 5022322
    assert parse_keyed(V2_FILES["cpu.stat"])["nr_throttled"] == 23
    assert parse_keyed("garbage\nusage_usec 5\nx y z\n") == {"usage_usec": 5}
    assert parse_io_stat_v2(V2_IO_STAT) == (5369856, 4096)
    assert parse_io_stat_v2(V2_FILES["io.stat"]) == (0, 0)
    two = "8:0 rbytes=10 wbytes=20 rios=1 wios=2\n8:16 rbytes=5 wbytes=7 dbytes=9\n"
    assert parse_io_stat_v2(two) == (15, 27)
    assert parse_io_stat_v2("") == (0, 0)
    assert parse_blkio_v1(V1_BLKIO) == (1159168 + 4096, 8192)  # not Total, not Sync
    assert parse_blkio_v1(V1_FILES["blkio.throttle.io_service_bytes_recursive"]) == (0, 0)


def test_a_v1_reading(tmp_path: Path) -> None:
    places = cgroup_places(V1_PROC_CGROUP, root=str(tmp_path))
    assert places is not None
    for directory in {places.memory, places.cpu, places.pids, places.io}:
        assert directory is not None
        tree(Path(directory), V1_FILES)
    sample = read_sample(places)
    assert sample is not None
    assert sample.cgroup == "v1"
    assert sample.memory_bytes == 108662784
    assert sample.memory_peak_bytes == 108818432
    assert sample.cpu_time_s == pytest.approx(0.069470402)
    assert sample.pids == 4
    assert (sample.io_read_bytes, sample.io_write_bytes) == (0, 0)
    assert sample.cpu_rate is None


def test_a_v2_reading_and_a_kernel_without_memory_peak(tmp_path: Path) -> None:
    places = cgroup_places(V2_PROC_CGROUP, root=str(tmp_path))
    assert places is not None
    tree(Path(places.memory), V2_FILES)
    sample = read_sample(places)
    assert sample is not None
    assert sample.cgroup == "v2"
    assert sample.memory_bytes == 108560384
    assert sample.memory_peak_bytes == 108560384
    assert sample.cpu_time_s == pytest.approx(5.022322)
    assert sample.pids == 4
    assert (sample.io_read_bytes, sample.io_write_bytes) == (0, 0)
    Path(f"{places.memory}/io.stat").write_text(V2_IO_STAT)
    with_io = read_sample(places)
    assert with_io is not None
    assert (with_io.io_read_bytes, with_io.io_write_bytes) == (5369856, 4096)
    os.unlink(f"{places.memory}/memory.peak")  # before 5.19 there is none
    older = read_sample(places)
    assert older is not None
    assert older.memory_peak_bytes is None
    assert older.memory_bytes == 108560384


def test_a_cgroup_gone_reads_as_none(tmp_path: Path) -> None:
    places = cgroup_places(V2_PROC_CGROUP, root=str(tmp_path))
    assert places is not None
    assert read_sample(places) is None  # never there, or removed with its container


def reading(cpu_time_s: float | None) -> Metrics:
    return Metrics(
        at=0.0,
        cgroup="v1",
        cpu_time_s=cpu_time_s,
        cpu_rate=None,
        memory_bytes=3 << 20,
        memory_peak_bytes=5 << 20,
        pids=2,
        io_read_bytes=0,
        io_write_bytes=1536,
    )


def test_the_cpu_rate() -> None:
    assert with_rate(reading(2.0), None, 1.0).cpu_rate is None
    assert with_rate(reading(2.0), reading(1.5), 0.5).cpu_rate == pytest.approx(1.0)
    assert with_rate(reading(2.0), reading(None), 0.5).cpu_rate is None
    assert with_rate(reading(None), reading(1.0), 0.5).cpu_rate is None
    assert with_rate(reading(2.0), reading(1.0), 0.0).cpu_rate is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "1"])
def test_an_interval_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(SpecError, match="interval_s"):
        check_interval(bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"--interval: must be a positive number of seconds, not"):
        check_interval(0, "--interval")


def test_proc_cgroup_is_read_only_for_the_containers_process() -> None:
    # This test's own process is in no container: a daemon whose pid names a process of
    # this host outside the container's cgroup is one whose pids are not this host's.
    text, why = read_cgroups(os.getpid(), CID)
    assert text is None
    assert "not in the container's cgroup" in why
    assert read_cgroups(0, CID) == (None, "it has no running init")
    gone = subprocess.Popen(["true"])
    gone.wait()
    text, why = read_cgroups(gone.pid, CID)
    assert text is None
    assert "no process of this host" in why


def test_the_top_layouts() -> None:
    sample = with_rate(reading(2.0), reading(1.75), 1.0)
    rows = [
        Row(container_id=CID, lease="a" * 32, name="sbxkit-one", metrics=sample),
        Row(container_id="f" * 64, lease="b" * 32, name="sbxkit-two", error="pid 7: no"),
    ]
    table = format_table(rows)
    assert table[0].split() == [
        *("CONTAINER", "LEASE", "CPU", "%", "CPU", "TIME", "MEM", "PEAK"),
        *("PIDS", "READ", "WRITE", "NAME"),
    ]
    assert table[1].split() == [
        *(CID[:12], "a" * 12, "25.0%", "2.00s", "3.0MiB", "5.0MiB", "2", "0B", "1.5KiB"),
        "sbxkit-one",
    ]
    assert table[2] == f"{'f' * 12}  {'b' * 12}  pid 7: no  sbxkit-two"
    lines = [json.loads(line) for line in format_json(rows)]
    assert lines[0]["metrics"]["cpu_rate"] == pytest.approx(0.25)
    assert lines[0]["metrics"]["memory_bytes"] == 3 << 20
    assert lines[1]["metrics"] is None
    assert lines[1]["error"] == "pid 7: no"
