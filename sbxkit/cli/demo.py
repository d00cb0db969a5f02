"""``sbxkit demo``: run a handful of hostile payloads and show each limit holding.

Each check is one real sandbox on the local engine. The demo exits 0 only if every limit held
and every container it created is gone afterwards. Its sandboxes carry a label of this demo
run (``sbxkit.cli.demo=<token>``), and only those are counted: on a shared daemon, other users'
sandboxes and the user's own parked ``--pool`` containers carry the lease label too, and are
none of the demo's business.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import msgspec
import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.uid_holds import host_id_problem
from sbxkit._model.result import RunResult
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._model.uids import HOST_UIDS, ranges_shown, reserved_range_of
from sbxkit._util.unwrap import plain_async
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine, open_engine


class Check(msgspec.Struct, frozen=True):
    title: str
    script: str
    expect: str
    holds: Callable[[RunResult], bool]
    limits: dict[str, float] = {}
    stdin: bytes | None = None


def _out(result: RunResult) -> str:
    return result.stdout.decode("utf-8", "replace").strip()


def _own_ids(text: str) -> bool:
    """``id -u; id -g`` printed one id twice, from a sandbox range, that no host account has."""
    ids = text.split()
    if len(ids) != 2 or ids[0] != ids[1] or not ids[0].isdigit():
        return False
    uid = int(ids[0])
    uids = reserved_range_of(uid)
    return uids is not None and (uids != HOST_UIDS or host_id_problem(uid) is None)


CHECKS = [
    Check(
        "runs as a uid of its own",
        "id -u; id -g",
        f"uid = gid in {ranges_shown()}, no host account",
        lambda r: r.ok and _own_ids(_out(r)),
    ),
    Check(
        "root filesystem is read-only",
        "echo x > /etc/owned",
        "write refused",
        lambda r: r.status == "exited" and r.exit_code != 0,
    ),
    Check(
        "scratch /tmp is writable",
        "echo ok > /tmp/f && cat /tmp/f",
        "ok",
        lambda r: r.ok and _out(r) == "ok",
    ),
    Check(
        "per-file size ceiling (1 MiB)",
        "dd if=/dev/zero of=/tmp/big bs=64k count=32",
        "write past 1 MiB fails",
        lambda r: r.status == "exited" and r.exit_code != 0,
        {"fsize_bytes": MiB},
    ),
    Check(
        "no network but loopback",
        "ls /sys/class/net | tr '\\n' ' '",
        "lo only",
        lambda r: r.ok and _out(r) == "lo",
    ),
    Check(
        "process ceiling (32)",
        "i=0; while [ $i -lt 64 ]; do sleep 5 & i=$((i+1)); done; echo started $i",
        "fork refused",
        lambda r: b"can't fork" in r.stderr and b"started" not in r.stdout,
        {"pids": 32},
    ),
    Check(
        "memory ceiling (32 MiB)",
        "tail /dev/zero",
        "OOM-killed",
        lambda r: r.status == "oom_killed",
        {"memory_bytes": 32 * MiB},
    ),
    Check(
        "elapsed-time limit (1 s)",
        "sleep 30",
        "timed out",
        lambda r: r.status == "timed_out",
        {"timeout_s": 1.0},
    ),
    Check(
        "output cap (64 KiB per stream)",
        "yes",
        "output exceeded, 65536 bytes kept",
        lambda r: r.status == "output_exceeded" and len(r.stdout) == 64 * 1024,
        {"output_bytes": 64 * 1024},
    ),
    Check(
        "stdin then EOF", "wc -c", "5 bytes read", lambda r: r.ok and _out(r) == "5", stdin=b"hello"
    ),
]

DEMO_LABEL = "sbxkit.cli.demo"
"""Every sandbox of one demo run carries ``DEMO_LABEL=<that run's token>``."""

BASE = {"cpus": 0.5, "memory_bytes": 64 * MiB, "pids": 64, "output_bytes": MiB, "timeout_s": 20.0}


def _describe(result: RunResult) -> str:
    if result.status == "exited":
        first = (_out(result) or result.stderr.decode("utf-8", "replace").strip()).splitlines()
        return f"exit {result.exit_code}" + (f": {first[0][:40]}" if first else "")
    return result.status.replace("_", " ")


def _total(result: RunResult) -> float:
    t = result.timings
    return t.create_s + t.start_s + t.run_s + t.remove_s


@plain_async  # Ctrl-C or a run's error leaves the nursery as itself, not as a group
async def _run_all(engine: Engine, image: str, token: str) -> list[tuple[Check, RunResult]]:
    results: list[tuple[Check, RunResult] | None] = [None] * len(CHECKS)

    async def one(index: int, check: Check) -> None:
        limits = Limits(**{**BASE, **check.limits})  # type: ignore[arg-type]
        spec = SandboxSpec(
            image=image,
            command=["sh", "-c", check.script],
            limits=limits,
            labels={DEMO_LABEL: token},
        )
        # Waits for each removal: a run on the kernel path returns at the payload's exit, and
        # the count of containers left behind below must not catch one being removed.
        backend = DockerBackend(engine=engine, wait_for_removal=True)
        results[index] = (check, await run(spec, check.stdin, backend=backend))

    limiter = trio.CapacityLimiter(2)

    async def limited(index: int, check: Check) -> None:
        async with limiter:
            await one(index, check)

    async with trio.open_nursery() as nursery:
        for index, check in enumerate(CHECKS):
            nursery.start_soon(limited, index, check)
    return [r for r in results if r is not None]


async def _left_behind(engine: Engine, token: str) -> list[object]:
    """The demo's containers still there: every run returned once its removal was confirmed."""
    return list(await engine.container_list(label=f"{DEMO_LABEL}={token}"))


async def _demo(image: str, socket_path: str | None) -> int:
    async with open_engine(socket_path) as engine:
        print(
            f"sbxkit demo: {len(CHECKS)} hostile payloads in {image} on {engine.socket_path} "
            f"(API {engine.api_version})\n"
        )
        token = secrets.token_hex(8)
        outcomes = await _run_all(engine, image, token)
        width = max(len(c.title) for c in CHECKS)
        failures = 0
        for check, result in outcomes:
            held = check.holds(result)
            failures += not held
            mark = "holds " if held else "BROKEN"
            print(
                f"  {mark}  {check.title:<{width}}  expected {check.expect:<34} "
                f"got {_describe(result)}  [{_total(result):.2f} s]"
            )
        leftovers = await _left_behind(engine, token)
        print(f"\n  containers this demo left behind: {len(leftovers)}")
        ok = failures == 0 and not leftovers
        print("  every limit held." if ok else f"  {failures} check(s) failed.")
        return 0 if ok else 1


def main(*, image: str, socket_path: str | None) -> int:
    return trio.run(_demo, image, socket_path)
