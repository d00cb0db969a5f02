"""Where one pooled claim's time goes (a diagnostic, not a registered benchmark).

``python -m bench.pool_timeline [--claims N] [--runtimes runc,crun]`` parks ``N`` containers
per runtime (``open_pool(..., refill=False)``: no refill competes with the claims), then claims
them one at a time, alternating runtimes, each after the previous one's removal
(``wait_for_removal=True``), so the daemon is otherwise idle.
The payload is busybox ``adjtimex``, which prints the kernel's wall clock (µs) and exits: the
last thing the payload does, so its clock reading is the payload's exit to within microseconds
(the container shares the host's kernel clock).

Each claim's timeline, in unix seconds (``time.time()``; sbxkit's code is untouched — the
parked slot's attach stream, wait call and the engine's inspect are wrapped on their instances):

- ``claim``: ``pool.run`` called;
- ``line_written``: the attach stream's ``send_all`` of the claim line returned;
- ``payload_clock``: what the payload printed;
- ``task_exit``: containerd's ``/tasks/exit`` event for the container (``ctr events`` on the
  daemon's containerd socket; the shim's timestamp), when ``--containerd`` is readable;
- ``finished_at``: the daemon's ``State.FinishedAt`` (read by the verdict's inspect);
- ``task_deleted``: containerd's ``/tasks/delete`` event (the daemon asked containerd to
  delete the exited task, and the runtime's ``delete`` ran), when ``--containerd`` is given;
- ``output_eof``: the attach stream's end (the daemon closed the payload's output);
- ``wait_reply``: the wait call's reply decoded;
- ``judged``: the verdict's one inspect returned (``pool.run`` returns right after it when it
  does not wait for the removal);
- ``removed``: ``pool.run(..., wait_for_removal=True)`` returned, the container removed.

``claim → judged`` is what ``bench pool``'s pooled contender times (it does not wait for the
removal).

Reported: the median, p10 and p90 of each step (the difference of consecutive points) over the
claims, and of the whole claim.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from bench.suite import default_busybox, default_socket
from sbxkit._lifecycle.outcome import docker_time
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import open_engine
from sbxkit.pool import Pool, open_pool

LABEL = "sbxkit.bench-pool-timeline"
POINTS = (
    "claim",
    "line_written",
    "payload_clock",
    "task_exit",
    "finished_at",
    "task_deleted",
    "output_eof",
    "wait_reply",
    "judged",
    "removed",
)
T = TypeVar("T")


def spec_of(image: str, runtime: str | None) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        runtime=runtime,
        command=["adjtimex"],
        limits=Limits(cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=30),
        labels={LABEL: "1"},
    )


def payload_clock(stdout: bytes) -> float:
    text = stdout.decode()
    sec = re.search(r"time\.tv_sec:\s*(\d+)", text)
    usec = re.search(r"time\.tv_usec:\s*(\d+)", text)
    if sec is None or usec is None:
        raise RuntimeError(f"adjtimex printed no time: {text!r}")
    return int(sec.group(1)) + int(usec.group(1)) / 1e6


class TaskExits:
    """containerd's ``/tasks/exit`` and ``/tasks/delete`` events, by container id (``ctr
    events`` in the background)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.at: dict[str, float] = {}
        self.deleted_at: dict[str, float] = {}
        self.seen = trio.Event()

    async def follow(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        command = ["ctr", "--address", self.address, "--namespace", "moby", "events"]
        process = await trio.lowlevel.open_process(command, stdout=-1)
        try:
            assert process.stdout is not None
            task_status.started()
            buffer = b""
            while chunk := await process.stdout.receive_some(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._parse(line.decode(errors="replace"))
        finally:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()

    async def exit_of(self, container_id: str) -> float | None:
        with trio.move_on_after(1.0):
            while container_id not in self.at:
                await self.seen.wait()
        return self.at.get(container_id)

    def _parse(self, line: str) -> None:
        match = re.match(r"(\S+ \S+) \+0000 UTC moby /tasks/(exit|delete) (\{.*\})", line)
        if match is None:
            return
        body = json.loads(match.group(3))
        stamp = docker_time(match.group(1).replace(" ", "T") + "Z")
        if stamp is not None:
            kind = self.at if match.group(2) == "exit" else self.deleted_at
            kind[body.get("container_id", "")] = stamp
            self.seen.set()
            self.seen = trio.Event()


def timed(points: dict[str, float], name: str, call: Callable[..., Awaitable[T]]) -> Any:
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        value = await call(*args, **kwargs)
        points.setdefault(name, time.time())
        return value

    return wrapper


async def one_claim(pool: Pool, spec: SandboxSpec, exits: TaskExits | None) -> dict[str, float]:
    slot = pool.parking.ready[0]  # the one pool.run takes next (no refill, claims one at a time)
    points: dict[str, float] = {}
    receive = slot.attach.receive_some

    async def receive_some(max_bytes: int = 65536) -> bytes:
        data = await receive(max_bytes)
        if not data:
            points.setdefault("output_eof", time.time())
        return data

    slot.attach.receive_some = receive_some  # type: ignore[method-assign]
    slot.attach.send_all = timed(points, "line_written", slot.attach.send_all)  # type: ignore[method-assign]
    slot.waiter.result = timed(points, "wait_reply", slot.waiter.result)  # type: ignore[method-assign]
    engine = slot.box.engine
    inspect = engine.container_inspect
    finished: list[str] = []

    async def container_inspect(container_id: str) -> Any:
        reply = await inspect(container_id)
        points.setdefault("judged", time.time())
        finished.append(reply.state.finished_at)
        return reply

    engine.container_inspect = container_inspect  # type: ignore[method-assign,assignment]
    try:
        points["claim"] = time.time()
        result = await pool.run(spec, wait_for_removal=True)
        points["removed"] = time.time()
    finally:
        engine.container_inspect = inspect  # type: ignore[method-assign]
    if not (result.ok and result.pooled):
        raise RuntimeError(f"claim: {result.status} {result.exit_code} pooled={result.pooled}")
    points["payload_clock"] = payload_clock(result.stdout)
    stamp = docker_time(finished[0]) if finished else None
    if stamp is not None:
        points["finished_at"] = stamp
    if exits is not None:
        exit_at = await exits.exit_of(slot.box.container_id)
        if exit_at is not None:
            points["task_exit"] = exit_at
        deleted_at = exits.deleted_at.get(slot.box.container_id)
        if deleted_at is not None:
            points["task_deleted"] = deleted_at
    return points


def summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000.0 for v in values)
    deciles = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) > 1 else ms * 9
    return {"median": statistics.median(ms), "p10": deciles[0], "p90": deciles[8], "n": len(ms)}


def steps(timelines: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each step between consecutive points present in every timeline, and the whole claim."""
    present = [p for p in POINTS if all(p in t for t in timelines)]
    out = {
        f"{a} → {b}": summary([t[b] - t[a] for t in timelines])
        for a, b in itertools.pairwise(present)
    }
    out["payload_clock → wait_reply"] = summary(
        [t["wait_reply"] - t["payload_clock"] for t in timelines]
    )
    out["claim → judged"] = summary([t["judged"] - t["claim"] for t in timelines])
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One pool per runtime, claims alternating between them (drift lands on all alike)."""
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    specs = {r: spec_of(args.image, None if r == "runc" else r) for r in runtimes}
    settings = Settings(supervisor_state_dir=args.state_dir) if args.state_dir else None
    timelines: dict[str, list[dict[str, float]]] = {r: [] for r in runtimes}
    async with open_engine(args.socket) as engine, trio.open_nursery() as nursery:
        exits: TaskExits | None = None
        if args.containerd:
            exits = TaskExits(args.containerd)
            await nursery.start(exits.follow)
        backend = DockerBackend(engine=engine, settings=settings)
        async with contextlib.AsyncExitStack() as stack:
            pools = {
                r: await stack.enter_async_context(
                    open_pool(spec, size=args.claims, backend=backend, refill=False)
                )
                for r, spec in specs.items()
            }
            with trio.fail_after(300):
                for pool in pools.values():
                    await pool.wait_ready()
            await trio.sleep(1.0)  # let the daemon settle after parking them all
            for _ in range(args.claims):
                for r, pool in pools.items():
                    timelines[r].append(await one_claim(pool, specs[r], exits))
        nursery.cancel_scope.cancel()
    return {
        "claims_per_runtime": args.claims,
        "order": "claims alternate between the runtimes' pools: " + ", ".join(runtimes),
        "runtimes": {
            r: {"steps_ms": steps(t), "exit_path_share": exit_share(t), "timelines": t}
            for r, t in timelines.items()
        },
    }


def exit_share(timelines: list[dict[str, float]]) -> float:
    """The median over claims of (payload exit → wait reply) / (claim → judged)."""
    return statistics.median(
        (t["wait_reply"] - t["payload_clock"]) / (t["judged"] - t["claim"]) for t in timelines
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m bench.pool_timeline", description=__doc__
    )
    parser.add_argument("--claims", type=int, default=20, help="per runtime")
    parser.add_argument("--socket", default=default_socket())
    parser.add_argument("--image", default=default_busybox())
    parser.add_argument("--state-dir", default=None, help="supervisor state dir")
    parser.add_argument(
        "--runtimes", default="runc", help="comma-separated OCI runtimes (runc: the default)"
    )
    parser.add_argument(
        "--containerd",
        default=None,
        metavar="SOCKET",
        help="the daemon's containerd socket, for the /tasks/exit times (needs ctr)",
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="write the timelines too")
    args = parser.parse_args(argv)
    report = trio.run(measure, args)
    for runtime, info in report["runtimes"].items():
        print(f"{runtime}: {args.claims} claims (exit path share {info['exit_path_share']:.2f})")
        for name, s in info["steps_ms"].items():
            print(
                f"  {name:<32} median {s['median']:7.2f} ms   p10 {s['p10']:7.2f}   "
                f"p90 {s['p90']:7.2f}   n {s['n']}"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
