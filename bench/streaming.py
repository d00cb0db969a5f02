"""Benchmark ``streaming``: MB/s of a 256 MiB stdout through sbxkit vs the raw attach stream.

The payload is ``head -c 268435456 /dev/zero`` in busybox. Contenders, interleaved:

``sbxkit`` ``await sbxkit._consumers.runner.run(spec, engine=engine)`` with ``output_bytes`` 257 MiB
(the cap above the output, so all 256 MiB is captured and kept, as a caller would get it), the
runner's default owner. Its stream window is ``RunResult.timings.run_s``: start returned → exit
reply + drain, during which sbxkit demultiplexes and caps every frame. ``raw`` The floor: the same
hardened create body (``build_create_body`` of the same spec, so the daemon does exactly the same
work — log driver ``none``, init, limits), then a minimal reader on the standard library: a Unix
socket, ``POST /attach?stream=1&stdout=1&stderr=1`` with ``Upgrade: tcp``, start through a second
connection, then ``recv_into`` a 1 MiB buffer, parsing the 8-byte frame headers and counting payload
bytes (not keeping them). Window: start returned → EOF on the attach socket. Run in a worker thread.
``raw_keep`` Diagnostic: the same reader keeping the stdout payload as a caller would get it
(appended to a ``bytearray``, one ``bytes`` at the end), so ``sbxkit/raw_keep`` says how much of the
gap to ``raw`` is keeping 256 MiB rather than sbxkit's own per-read and per-frame work.

MB/s = 268435456 / 10^6 / window. Also reported: the client process's CPU seconds per run
(``time.process_time``, all threads), since on 2 cores the client competes with the daemon.

Target (the issue): sbxkit ≥ 0.8 × raw, as a ratio of median MB/s from one run.
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import time
from typing import Any

import msgspec
import trio

from bench import common
from bench.harness import ContenderFailed, machine_facts, ratio_of_medians, say
from bench.rawapi import RAW_API_VERSION, RawEngine
from bench.suite import (
    ActivityWatch,
    LeakCheck,
    default_busybox,
    fmt,
    label_of,
    summarise,
)
from sbxkit._consumers.runner import run
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.policy import build_create_body
from sbxkit.engine.client import Engine, open_engine

NAME = "streaming"
SUMMARY = "MB/s of a 256 MiB stdout: sbxkit vs a raw attach-stream reader (stdlib)"

TARGET_RATIO = 0.8
DEFAULT_BYTES = 256 * MiB
DEFAULT_ROUNDS = 5
QUICK_ROUNDS = 2
CONTENDERS = ("sbxkit", "raw", "raw_keep")
LABELS = {
    "sbxkit": "sbxkit run()",
    "raw": "raw attach reader",
    "raw_keep": "raw reader, keeping stdout",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--warmup", type=int, default=1, help="discarded rounds (default 1)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds")
    parser.add_argument(
        "--bytes", type=int, default=DEFAULT_BYTES, help="stdout size (default 256 MiB)"
    )
    common.add_daemon_arguments(parser, default_busybox())


def stream_spec(image: str, size: int, key: str) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["head", "-c", str(size), "/dev/zero"],
        limits=Limits(
            cpus=1.0,
            memory_bytes=64 * MiB,
            pids=64,
            output_bytes=size + MiB,
            timeout_s=300,
        ),
        labels=label_of(NAME, key),
    )


def raw_body(image: str, size: int) -> bytes:
    """sbxkit's exact hardened body for the same spec, labelled as the bench's own."""
    body = build_create_body(stream_spec(image, size, "raw"), secrets.token_hex(16))
    data: dict[str, Any] = msgspec.to_builtins(body)
    data["Labels"] = label_of(NAME, "raw")
    return json.dumps(data).encode()


class FrameCounter:
    """Counts payload bytes per stream id of a multiplexed attach stream, incrementally."""

    def __init__(self, keep: bool = False) -> None:
        self.header = bytearray()
        self.remaining = 0
        self.stream = 0
        self.counts = [0, 0, 0, 0]
        self.kept: bytearray | None = bytearray() if keep else None

    def feed(self, data: memoryview) -> None:
        pos, end = 0, len(data)
        while pos < end:
            if self.remaining:
                take = min(self.remaining, end - pos)
                self.counts[self.stream] += take
                if self.kept is not None and self.stream == 1:
                    self.kept += data[pos : pos + take]
                self.remaining -= take
                pos += take
                continue
            need = 8 - len(self.header)
            self.header += data[pos : pos + need]
            pos += min(need, end - pos)
            if len(self.header) == 8:
                self.stream = self.header[0] if self.header[0] < 4 else 3
                self.remaining = int.from_bytes(self.header[4:8], "big")
                self.header.clear()


def raw_stream(
    api: RawEngine, socket_path: str, body: bytes, keep: bool = False
) -> dict[str, float]:
    """create → attach (hijack) → start → count frames to EOF → wait → remove; blocking."""
    name = "sbxbench-stream-" + secrets.token_hex(8)
    container_id: str | None = None
    t0 = time.perf_counter()
    try:
        _, reply = api.call("POST", f"/containers/create?name={name}", body, ok=(201,))
        container_id = str(json.loads(reply)["Id"])
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(120)
            sock.connect(socket_path)
            sock.sendall(
                f"POST /v{RAW_API_VERSION}/containers/{container_id}/attach?stream=1&stdout=1"
                "&stderr=1 HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError("raw: attach closed before its response head")
                head += chunk
            head, _, early = head.partition(b"\r\n\r\n")
            if b" 101 " not in head.split(b"\r\n", 1)[0]:
                raise RuntimeError(f"raw: attach answered {head[:200]!r}")
            api.call("POST", f"/containers/{container_id}/start", ok=(204,))
            t_started = time.perf_counter()
            counter = FrameCounter(keep)
            counter.feed(memoryview(early))
            buffer = bytearray(1 << 20)
            view = memoryview(buffer)
            while True:
                n = sock.recv_into(buffer)
                if not n:
                    break
                counter.feed(view[:n])
            if counter.kept is not None:
                stdout = bytes(counter.kept)  # what a caller gets, like RunResult.stdout
                counter.kept = None
                del stdout
            t_eof = time.perf_counter()
        finally:
            sock.close()
        _, reply = api.call("POST", f"/containers/{container_id}/wait", ok=(200,))
        status = json.loads(reply).get("StatusCode")
        if status != 0:
            raise RuntimeError(f"raw: exit status {status}")
        return {
            "window_s": t_eof - t_started,
            "bytes": float(counter.counts[1]),
            "other_bytes": float(counter.counts[0] + counter.counts[2] + counter.counts[3]),
            "total_s": time.perf_counter() - t0,
        }
    finally:
        api.remove(container_id or name)


async def sbxkit_stream(engine: Engine, spec: SandboxSpec) -> dict[str, float]:
    t0 = time.perf_counter()
    result = await run(spec, engine=engine)
    total = time.perf_counter() - t0
    if not result.ok:
        raise RuntimeError(f"sbxkit: {result.status} {result.exit_code} {result.stderr[:200]!r}")
    return {
        "window_s": result.timings.run_s,
        "bytes": float(len(result.stdout)),
        "other_bytes": float(len(result.stderr)),
        "total_s": total,
    }


async def measure(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    size = args.bytes
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in CONTENDERS}
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    api = RawEngine(args.socket)
    body = raw_body(args.image, size)
    spec = stream_spec(args.image, size, "sbxkit")
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        say(f"{NAME}: {args.warmup} warm-up + {rounds} rounds of {CONTENDERS}, {size} bytes")
        await trio.to_thread.run_sync(activity.start)
        try:
            for round_no in range(-args.warmup, rounds):
                for key in CONTENDERS:
                    cpu0 = time.process_time()
                    try:
                        if key == "sbxkit":
                            sample = await sbxkit_stream(engine, spec)
                        else:
                            sample = await trio.to_thread.run_sync(
                                raw_stream, api, args.socket, body, key == "raw_keep"
                            )
                    except Exception as exc:
                        raise ContenderFailed(key, round_no, exc) from exc
                    sample["client_cpu_s"] = time.process_time() - cpu0
                    if sample["bytes"] != size:
                        raise ContenderFailed(
                            key, round_no, RuntimeError(f"got {sample['bytes']:.0f} bytes")
                        )
                    if round_no >= 0:
                        samples[key].append(sample)
                if round_no >= 0:
                    say(f"  round {round_no + 1}/{rounds}")
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            with trio.CancelScope(shield=True):
                api.close()
                found = await common.stop_and_sweep(facts, activity, leaks)
    return build_report(args, rounds, size, samples, facts, errors, found, leaks.leftovers)


def build_report(
    args: argparse.Namespace,
    rounds: int,
    size: int,
    samples: dict[str, list[dict[str, float]]],
    facts: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[str],
) -> dict[str, Any]:
    complete = not errors and all(len(v) == rounds for v in samples.values())
    windows = {k: [s["window_s"] for s in v] for k, v in samples.items()}
    contenders = {
        k: {
            "label": LABELS[k],
            "stream_mb_per_s": summarise([size / 1e6 / w for w in windows[k]]),
            "window_s": summarise(windows[k]),
            "total_run_s": summarise([s["total_s"] for s in samples[k]]),
            "client_cpu_s": summarise([s["client_cpu_s"] for s in samples[k]]),
            "samples_window_s": [round(w, 4) for w in windows[k]],
        }
        for k in CONTENDERS
    }
    ratios: dict[str, Any] = {}
    if complete:
        # MB/s ratio = inverse ratio of stream windows (same bytes, paired rounds).
        ratios["sbxkit/raw MB/s"] = ratio_of_medians(windows["raw"], windows["sbxkit"])
        ratios["sbxkit/raw_keep MB/s"] = ratio_of_medians(windows["raw_keep"], windows["sbxkit"])
        ratios["raw_keep/raw MB/s"] = ratio_of_medians(windows["raw"], windows["raw_keep"])
        ratios["sbxkit/raw total run time"] = ratio_of_medians(
            [s["total_s"] for s in samples["sbxkit"]], [s["total_s"] for s in samples["raw"]]
        )
    measured = ratios.get("sbxkit/raw MB/s", {}).get("ratio")
    series = [
        {
            "label": LABELS[k],
            "median": [contenders[k]["stream_mb_per_s"].get("median")],
            "low": [contenders[k]["stream_mb_per_s"].get("p10")],
            "high": [contenders[k]["stream_mb_per_s"].get("p90")],
        }
        for k in CONTENDERS
    ]
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "quick": bool(args.quick),
            "bytes": size,
            "command": ["head", "-c", str(size), "/dev/zero"],
            "image": args.image,
            "order": list(CONTENDERS),
            "mb": "10^6 bytes",
            "window": "start returned → end of stream (sbxkit: RunResult.timings.run_s)",
        },
        "contenders": contenders,
        "ratios": ratios,
        "targets": [
            {
                "expression": f"sbxkit/raw MB/s >= {TARGET_RATIO}",
                "ratio": measured,
                "met": None if measured is None else measured >= TARGET_RATIO,
            }
        ],
        "plot": {
            "title": f"streaming: {size // MiB} MiB of stdout",
            "ylabel": "MB/s (median, whiskers p10–p90)",
            "groups": ["stdout stream"],
            "series": series if complete else [],
        },
        **common.outcome(errors, leaks, leftovers),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# streaming — {cfg['bytes'] // MiB} MiB of stdout",
        "",
        f"{m['date']} · {cfg['rounds']} rounds (+{cfg['warmup']} warm-up), interleaved "
        f"`{' → '.join(cfg['order'])}` · `{' '.join(cfg['command'])}` · "
        f"{common.docker_md(m)} · MB = 10^6 bytes",
        "",
        "| contender | MB/s median | p10 | p90 | min | max | window s (median) | whole run s "
        "(median) | client CPU s (median) | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for info in report["contenders"].values():
        s = info["stream_mb_per_s"]
        out.append(
            f"| {info['label']} | {fmt(s.get('median'))} | {fmt(s.get('p10'))} | "
            f"{fmt(s.get('p90'))} | {fmt(s.get('min'))} | {fmt(s.get('max'))} | "
            f"{fmt(info['window_s'].get('median'), 2)} | "
            f"{fmt(info['total_run_s'].get('median'), 2)} | "
            f"{fmt(info['client_cpu_s'].get('median'), 2)} | {s['n']} |"
        )
    out += common.ratio_table_md(report["ratios"])
    for target in report["targets"]:
        out += common.target_md(target)
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    report = trio.run(measure, args, rounds)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
