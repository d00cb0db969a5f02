"""Benchmark ``cancel_latency``: from cancelling a running sandbox to the daemon's ``destroy``.

Each sample starts ``sleep 30`` in busybox, waits until the daemon reports the container's
``start`` event, then cancels; the latency is the daemon's ``destroy`` event time minus the
moment of cancellation (both the host's wall clock: the daemon stamps events with
``time.Now()``). Events are read live by the standard-library client (``bench.rawapi``), an
independent witness. Contenders, interleaved sample by sample:

``sbxkit`` ``sbxkit._consumers.runner.run(spec, engine=engine)`` (default owner: the supervisor) in
a trio cancel scope; cancellation = ``scope.cancel()``. The run removes its container (shielded,
through the owner) before the cancellation propagates. ``sbxkit_inproc`` The same with
``owner=InProcessOwner(engine)``. ``raw`` The floor: create + start through the raw API in a worker
thread; cancellation = ``DELETE /containers/{id}?force=1&v=1`` (kill and remove in one call).

Also reported: ``unwound`` — cancellation to the cancelled call returning in the client.

Target (the issue): sbxkit p99 ≤ 1 s, n ≥ 30. With n = 30, p99 interpolates between the two
largest samples, so it is nearly the maximum.
"""

from __future__ import annotations

import argparse
import json
import secrets
import threading
import time
from typing import Any

import trio

from bench import common
from bench.harness import ContenderFailed, machine_facts, ratio_of_medians, say
from bench.rawapi import EventWatch, RawEngine
from bench.suite import (
    ActivityWatch,
    LeakCheck,
    default_busybox,
    fmt,
    label_of,
    peer_body,
    summarise,
)
from sbxkit._consumers.runner import run
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.engine.client import Engine, open_engine

NAME = "cancel_latency"
SUMMARY = "cancel → container destroyed (daemon event), p50/p99: sbxkit vs raw DELETE force"

TARGET_P99_S = 1.0
DEFAULT_SAMPLES = 60
QUICK_SAMPLES = 10
SAMPLE_LABEL = "sbxkit.bench.sample"
CONTENDERS = ("sbxkit", "sbxkit_inproc", "raw")
LABELS = {
    "sbxkit": "sbxkit (supervisor owner)",
    "sbxkit_inproc": "sbxkit (in-process owner)",
    "raw": "raw DELETE ?force=1",
}
EVENT_WAIT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--samples",
        "--rounds",
        dest="samples",
        type=int,
        default=None,
        help=f"per contender (default {DEFAULT_SAMPLES})",
    )
    parser.add_argument("--warmup", type=int, default=1, help="discarded samples (default 1)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SAMPLES} samples")
    common.add_daemon_arguments(parser, default_busybox())


LIMITS = {"cpus": 0.5, "memory_bytes": 32 * MiB, "pids": 32}


class Events:
    """The daemon's start/destroy events for our samples, indexed by sample label."""

    def __init__(self, socket_path: str) -> None:
        self.watch = EventWatch(
            socket_path,
            {"type": ["container"], "event": ["start", "destroy"], "label": [SAMPLE_LABEL]},
        )
        self.thread = threading.Thread(target=self.watch.run, name="sbxbench-cancel", daemon=True)
        self.seen = 0
        self.started: dict[str, dict[str, Any]] = {}
        self.destroyed: dict[str, dict[str, Any]] = {}

    def start(self) -> None:
        self.thread.start()
        self.watch.ready.wait(10.0)
        if self.watch.error:
            raise RuntimeError(f"event stream: {self.watch.error}")

    def _scan(self) -> None:
        events = self.watch.events
        while self.seen < len(events):
            event = events[self.seen]
            self.seen += 1
            sample = ((event.get("Actor") or {}).get("Attributes") or {}).get(SAMPLE_LABEL)
            if sample is None:
                continue
            table = self.started if event.get("Action") == "start" else self.destroyed
            table.setdefault(sample, event)

    async def wait_for(self, table: str, sample: str) -> dict[str, Any]:
        with trio.fail_after(EVENT_WAIT_S):
            while True:
                self._scan()
                found = getattr(self, table).get(sample)
                if found is not None:
                    return found
                if self.watch.error:
                    raise RuntimeError(f"event stream: {self.watch.error}")
                await trio.sleep(0.002)

    def stop(self) -> None:
        self.watch.stop()
        self.thread.join(10.0)


def sample_spec(image: str, key: str, sample: str) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["sleep", "30"],
        limits=Limits(**LIMITS, output_bytes=MiB, timeout_s=60),
        labels={**label_of(NAME, key), SAMPLE_LABEL: sample},
    )


async def sbxkit_sample(
    engine: Engine, events: Events, image: str, key: str, inproc: bool
) -> dict[str, float]:
    sample = secrets.token_hex(8)
    spec = sample_spec(image, key, sample)
    cancelled_ns = 0
    async with trio.open_nursery() as nursery:

        async def victim() -> None:
            owner = InProcessOwner(engine) if inproc else None
            await run(spec, engine=engine, owner=owner)
            raise RuntimeError(f"{key}: the run finished before it was cancelled")

        nursery.start_soon(victim)
        await events.wait_for("started", sample)
        cancelled_ns = time.time_ns()
        nursery.cancel_scope.cancel()
    unwound_ns = time.time_ns()
    destroyed = await events.wait_for("destroyed", sample)
    return {
        "destroyed_s": (int(destroyed["timeNano"]) - cancelled_ns) / 1e9,
        "unwound_s": (unwound_ns - cancelled_ns) / 1e9,
    }


async def raw_sample(api: RawEngine, events: Events, image: str) -> dict[str, float]:
    sample = secrets.token_hex(8)
    body = peer_body(
        image, ["sleep", "30"], {**label_of(NAME, "raw"), SAMPLE_LABEL: sample}, **LIMITS
    )
    name = f"sbxbench-cancel-{sample}"

    def create_and_start() -> str:
        _, reply = api.call(
            "POST", f"/containers/create?name={name}", json.dumps(body).encode(), ok=(201,)
        )
        container_id = str(json.loads(reply)["Id"])
        api.call("POST", f"/containers/{container_id}/start", ok=(204,))
        return container_id

    try:
        container_id = await trio.to_thread.run_sync(create_and_start)
        await events.wait_for("started", sample)
        cancelled_ns = time.time_ns()
        await trio.to_thread.run_sync(api.remove, container_id)
        unwound_ns = time.time_ns()
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(api.remove, name)
        raise
    destroyed = await events.wait_for("destroyed", sample)
    return {
        "destroyed_s": (int(destroyed["timeNano"]) - cancelled_ns) / 1e9,
        "unwound_s": (unwound_ns - cancelled_ns) / 1e9,
    }


async def measure(args: argparse.Namespace, n: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in CONTENDERS}
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    events = Events(args.socket)
    api = RawEngine(args.socket)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        say(f"{NAME}: {args.warmup} warm-up + {n} samples of {CONTENDERS}, interleaved")
        await trio.to_thread.run_sync(activity.start)
        await trio.to_thread.run_sync(events.start)
        try:
            for index in range(-args.warmup, n):
                for key in CONTENDERS:
                    try:
                        if key == "raw":
                            sample = await raw_sample(api, events, args.image)
                        else:
                            sample = await sbxkit_sample(
                                engine, events, args.image, key, key == "sbxkit_inproc"
                            )
                    except Exception as exc:
                        raise ContenderFailed(key, index, exc) from exc
                    if index >= 0:
                        samples[key].append(sample)
                if index >= 0 and (index + 1) % 10 == 0:
                    say(f"  {index + 1}/{n} samples")
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(events.stop)
                api.close()
                found = await common.stop_and_sweep(facts, activity, leaks)
    return build_report(args, n, samples, facts, errors, found, leaks.leftovers)


def build_report(
    args: argparse.Namespace,
    n: int,
    samples: dict[str, list[dict[str, float]]],
    facts: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[str],
) -> dict[str, Any]:
    complete = not errors and all(len(v) == n for v in samples.values())
    destroyed = {k: [s["destroyed_s"] * 1000 for s in v] for k, v in samples.items()}
    unwound = {k: [s["unwound_s"] * 1000 for s in v] for k, v in samples.items()}
    contenders = {
        k: {
            "label": LABELS[k],
            "to_destroy_ms": summarise(destroyed[k], p99=True),
            "to_unwound_ms": summarise(unwound[k], p99=True),
            "samples_to_destroy_ms": [round(v, 2) for v in destroyed[k]],
        }
        for k in CONTENDERS
    }
    ratios: dict[str, Any] = {}
    if complete:
        ratios["sbxkit/raw p50 to destroy"] = ratio_of_medians(
            destroyed["sbxkit"], destroyed["raw"]
        )
        ratios["sbxkit_inproc/raw p50 to destroy"] = ratio_of_medians(
            destroyed["sbxkit_inproc"], destroyed["raw"]
        )
        ratios["sbxkit/sbxkit_inproc p50 to destroy"] = ratio_of_medians(
            destroyed["sbxkit"], destroyed["sbxkit_inproc"]
        )
        raw_p99 = contenders["raw"]["to_destroy_ms"]["p99"]
        sbx_p99 = contenders["sbxkit"]["to_destroy_ms"]["p99"]
        ratios["sbxkit/raw p99 to destroy"] = {"ratio": sbx_p99 / raw_p99, "n": n}
    p99 = contenders["sbxkit"]["to_destroy_ms"].get("p99") if complete else None
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "samples": n,
            "warmup": args.warmup,
            "quick": bool(args.quick),
            "payload": ["sleep", "30"],
            "image": args.image,
            "order": list(CONTENDERS),
            "limits": LIMITS,
            "clock": "host wall clock: time.time_ns() at cancel vs the daemon's destroy timeNano",
            "started": "the daemon's `start` event for the container, read live",
        },
        "contenders": contenders,
        "ratios": ratios,
        "targets": [
            {
                "expression": f"sbxkit p99 cancel → destroy <= {TARGET_P99_S * 1000:.0f} ms",
                "value_ms": p99,
                "met": None if p99 is None else p99 <= TARGET_P99_S * 1000,
            }
        ],
        "plot": {
            "title": f"cancel → container destroyed (n = {n} each)",
            "ylabel": "ms (median, whiskers p10–p99)",
            "groups": ["cancel → destroy event", "cancel → call returned"],
            "series": [
                {
                    "label": LABELS[k],
                    "median": [
                        contenders[k]["to_destroy_ms"].get("median"),
                        contenders[k]["to_unwound_ms"].get("median"),
                    ],
                    "low": [
                        contenders[k]["to_destroy_ms"].get("p10"),
                        contenders[k]["to_unwound_ms"].get("p10"),
                    ],
                    "high": [
                        contenders[k]["to_destroy_ms"].get("p99"),
                        contenders[k]["to_unwound_ms"].get("p99"),
                    ],
                }
                for k in CONTENDERS
            ]
            if complete
            else [],
            "target": {"value": TARGET_P99_S * 1000, "label": "target p99 ≤ 1 s"},
        },
        **common.outcome(errors, leaks, leftovers),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        "# cancel_latency — cancel a running `sleep 30` until the daemon destroyed it",
        "",
        f"{m['date']} · {cfg['samples']} samples per contender (+{cfg['warmup']} warm-up), "
        f"interleaved `{' → '.join(cfg['order'])}` · {common.docker_md(m)}",
        "",
        "| contender | to destroy p50 ms | p90 | p99 | max | to call returned p50 ms | p99 | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for info in report["contenders"].values():
        d, u = info["to_destroy_ms"], info["to_unwound_ms"]
        out.append(
            f"| {info['label']} | {fmt(d.get('median'))} | {fmt(d.get('p90'))} | "
            f"{fmt(d.get('p99'))} | {fmt(d.get('max'))} | {fmt(u.get('median'))} | "
            f"{fmt(u.get('p99'))} | {d['n']} |"
        )
    out += common.ratio_table_md(report["ratios"], "ratio")
    for target in report["targets"]:
        if target["value_ms"] is not None:
            verdict = "**met**" if target["met"] else "**not met**"
            out += [
                "",
                f"Target `{target['expression']}`: {verdict} ({target['value_ms']:.1f} ms).",
            ]
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    n = common.pick(args.samples, args.quick, QUICK_SAMPLES, DEFAULT_SAMPLES)
    report = trio.run(measure, args, n)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
