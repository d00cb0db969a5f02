"""What the suite benchmarks (throughput, streaming, cancel_latency, client_memory, humaneval)
share beyond ``bench.harness``: their peers (docker-py, aiodocker), the leak sweep by label,
statistics in any unit, and writing JSON + markdown + PNG.

Every container a suite benchmark makes carries the label ``sbxkit.bench=<bench>:<contender>``;
the leak sweep lists containers through the standard-library witness (``bench.rawapi``, not
sbxkit), reports every one of ours that survived the run, and removes it. Other clients'
containers are never touched.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from bench.harness import say, write_atomically, write_json
from bench.rawapi import EventWatch, RawEngine

BENCH_LABEL = "sbxkit.bench"
RUN_LABEL = "sbxkit-test.run"
"""The label by which a test session's leak witness tells its own sandboxes from another
session's on a shared daemon (tests/witness.py): a bench run carries a value of its own."""
T = TypeVar("T")


def default_socket() -> str:
    explicit = os.environ.get("SBXKIT_TEST_SOCKET")
    if explicit:
        return explicit
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


def default_busybox() -> str:
    return os.environ.get("SBXKIT_TEST_BUSYBOX_IMAGE", "sbxkit-test/busybox:latest")


def default_python() -> str:
    return os.environ.get("SBXKIT_TEST_PYTHON_IMAGE", "sbxkit-test/python:latest")


def label_of(bench: str, contender: str) -> dict[str, str]:
    return {BENCH_LABEL: f"{bench}:{contender}"}


# --- statistics in any unit ----------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100) with linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(values: Sequence[float], *, p99: bool = False) -> dict[str, float | int]:
    """median, p10, p90 (and p99), min, max and n of ``values``, in their own unit."""
    if not values:
        return {"n": 0}
    out: dict[str, float | int] = {
        "median": statistics.median(values),
        "p10": percentile(values, 10),
        "p90": percentile(values, 90),
    }
    if p99:
        out["p99"] = percentile(values, 99)
    out.update({"min": min(values), "max": max(values), "n": len(values)})
    return out


def fmt(value: float | int | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# --- leaks and the shared-daemon check -----------------------------------------------------------


def ours(container: dict[str, Any], bench: str) -> bool:
    value = (container.get("Labels") or {}).get(BENCH_LABEL, "")
    return value.startswith(f"{bench}:")


class LeakCheck:
    """Snapshot before the run; afterwards every container of ``bench`` not in the snapshot
    is a leak: reported, then removed."""

    def __init__(self, socket_path: str, bench: str) -> None:
        self.bench = bench
        self.witness = RawEngine(socket_path)
        snapshot = self.witness.containers(label=BENCH_LABEL)
        self.before = {c["Id"] for c in snapshot}
        self.leftovers = [c["Id"][:12] for c in snapshot if ours(c, bench)]

    def ours_now(self) -> list[dict[str, Any]]:
        return [
            c
            for c in self.witness.containers(label=BENCH_LABEL)
            if ours(c, self.bench) and c["Id"] not in self.before
        ]

    def sweep(self) -> list[dict[str, Any]]:
        leaks = []
        for container in self.ours_now():
            removed = self.witness.remove(container["Id"])
            leaks.append(
                {
                    "id": container["Id"][:12],
                    "labels": container.get("Labels") or {},
                    "state": container.get("State"),
                    "removed_by_bench": removed,
                }
            )
        self.witness.close()
        return leaks


class ActivityWatch:
    """Container creations the daemon saw during the run, ours and other clients'."""

    def __init__(self, socket_path: str, bench: str) -> None:
        self.bench = bench
        self.watch = EventWatch(socket_path, {"type": ["container"], "event": ["create"]})
        self.thread = threading.Thread(target=self.watch.run, name="sbxbench-activity", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.watch.ready.wait(10.0)

    def stop(self) -> dict[str, Any]:
        self.watch.stop()
        self.thread.join(10.0)
        mine = 0
        foreign: list[str] = []
        for event in self.watch.events:
            attrs = (event.get("Actor") or {}).get("Attributes") or {}
            if attrs.get(BENCH_LABEL, "").startswith(f"{self.bench}:"):
                mine += 1
            else:
                foreign.append(str(attrs.get("name", "?")))
        return {
            "ours": mine,
            "foreign": len(foreign),
            "foreign_names_sample": foreign[:5],
            "watch_error": self.watch.error,
        }


def shared_daemon_warning(activity: dict[str, Any]) -> str | None:
    if activity.get("foreign"):
        return (
            f"the daemon was shared: {activity['foreign']} containers were created by other "
            f"clients during the run (ours: {activity['ours']}); figures are noisier for it"
        )
    return None


# --- peers ---------------------------------------------------------------------------------------


def peer_body(
    image: str,
    command: list[str],
    labels: dict[str, str],
    *,
    cpus: float,
    memory_bytes: int,
    pids: int,
    runtime: str | None = None,
) -> dict[str, Any]:
    """The Engine API create body the peers send: same bounds as sbxkit's spec, no network
    (``NetworkDisabled`` + ``NetworkMode: none``, as sbxkit sends), the daemon's defaults for
    everything else (no hardening)."""
    host: dict[str, Any] = {
        "Memory": memory_bytes,
        "MemorySwap": memory_bytes,
        "NanoCpus": round(cpus * 1e9),
        "PidsLimit": pids,
        "NetworkMode": "none",
    }
    if runtime:
        host["Runtime"] = runtime
    return {
        "Image": image,
        "Cmd": command,
        "Labels": labels,
        "NetworkDisabled": True,
        "HostConfig": host,
    }


def dockerpy_client(socket_path: str, pool_size: int) -> Any:
    """A docker-py client on the socket, its connection pool sized for ``pool_size`` threads."""
    import docker

    return docker.DockerClient(
        base_url=f"unix://{socket_path}", version="1.41", max_pool_size=max(pool_size, 10)
    )


def dockerpy_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """``client.containers.create`` keyword arguments equal to ``peer_body``."""
    host = body["HostConfig"]
    kwargs: dict[str, Any] = {
        "labels": body["Labels"],
        "network_disabled": True,
        "network_mode": "none",
        "mem_limit": host["Memory"],
        "memswap_limit": host["MemorySwap"],
        "nano_cpus": host["NanoCpus"],
        "pids_limit": host["PidsLimit"],
    }
    if "Runtime" in host:
        kwargs["runtime"] = host["Runtime"]
    return kwargs


def dockerpy_one_shot(client: Any, body: dict[str, Any], *, want_stderr: bool = False) -> Any:
    """What ``containers.run(..., remove=True)`` does, minus following the logs: create,
    start, wait, (stderr on failure), remove (forced, with volumes, in a ``finally``)."""
    container = client.containers.create(body["Image"], body["Cmd"], **dockerpy_kwargs(body))
    try:
        container.start()
        reply = container.wait()
        stderr = b""
        if want_stderr and reply.get("StatusCode") != 0:
            stderr = container.logs(stdout=False, stderr=True)
        return reply.get("StatusCode"), stderr
    finally:
        container.remove(force=True, v=True)


class AsyncioThread:
    """A persistent asyncio event loop in a thread, for aiodocker inside a trio benchmark.

    ``call(factory)`` blocks the calling (worker) thread until ``factory()``'s coroutine has
    run on the loop; trio code calls it through ``trio.to_thread.run_sync``.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sbxbench-asyncio")
        self.thread.daemon = True
        self.thread.start()

    def call(self, factory: Callable[[], Awaitable[T]]) -> T:
        async def wrapper() -> T:
            return await factory()

        future: Future[T] = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        return future.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)
        self.loop.close()


def aiodocker_client(socket_path: str) -> Any:
    import aiodocker

    return aiodocker.Docker(url=f"unix://{socket_path}", api_version="v1.41")


async def aiodocker_one_shot(docker: Any, body: dict[str, Any]) -> int:
    """create, start, wait, delete(force, v) — aiodocker's run-and-remove."""
    container = await docker.containers.create(body)
    try:
        await container.start()
        reply = await container.wait()
        return int(reply.get("StatusCode", -1))
    finally:
        await container.delete(force=True, v=True)


# --- output --------------------------------------------------------------------------------------


def write_outputs(out: Path | str, stem: str, report: dict[str, Any], markdown: str) -> list[Path]:
    """``stem.json``, ``stem.md`` and (matplotlib permitting) ``stem.png`` in ``out``; a run
    that failed to measure writes ``stem.failed.*`` so the last complete result survives."""
    if str(out) == "-":
        return []
    directory = Path(out)
    if not report.get("ok"):
        stem += ".failed"
    json_path = directory / f"{stem}.json"
    md_path = directory / f"{stem}.md"
    write_json(json_path, report)
    written = [json_path, md_path]
    png_path = directory / f"{stem}.png"
    from bench.plot import plot_report

    if plot_report(report, png_path):
        markdown += f"\n![{report['bench']}]({png_path.name})\n"
        written.append(png_path)
    write_atomically(md_path, markdown)
    say("wrote " + ", ".join(str(p) for p in written))
    return written


def standalone(
    name: str,
    summary: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    main: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None = None,
) -> int:
    """``python -m bench.NAME [options]``: the same as ``python -m bench NAME [options]``."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog=f"python -m bench.{name}", description=summary
    )
    add_arguments(parser)
    return main(parser.parse_args(argv))
