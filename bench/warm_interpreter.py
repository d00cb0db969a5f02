"""Benchmark ``warm_interpreter``: time to the first result of numpy code, warm vs cold.

Each round runs, in alternating order, on the pydata image (numpy, pandas and matplotlib,
``scripts/engine-up``):

``cold``
    ``sbxkit.run`` of ``python3 -c "import numpy; print(numpy.arange(10).sum())"``: a fresh
    sandbox is created and started, Python starts and imports numpy, and the first result is
    the moment its output ``45`` reaches the caller (``on_output``; the container's removal
    after it is not counted).
``warm``
    ``async with pool.interpreter()`` on an ``open_interpreter_pool(preload=["numpy",
    "pandas"])`` with an interpreter parked, then ``run_code("import numpy;
    numpy.arange(10).sum()")``: from the claim to the returned result. The claimed sandbox's
    removal and the wait for the next park are outside the timing (that is the pool's
    premise: it parks ahead of time).

Target (issue 44 item 2): warm / cold ≤ 0.1, as a ratio of medians from one run. A missed
target is reported, not fatal; a failing contender or a leaked container is (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import msgspec
import trio

from bench import common
from bench.harness import machine_facts, say, summarise_ms
from bench.rawapi import RawEngine
from bench.suite import default_socket
from sbxkit._consumers.interp_pool import InterpreterPool, open_interpreter_pool
from sbxkit._consumers.oneshot import run
from sbxkit._model.result import Stream
from sbxkit._model.spec import LEASE_LABEL, Limits, MiB, SandboxSpec
from sbxkit.engine.client import Engine, open_engine

NAME = "warm_interpreter"
SUMMARY = "first result of `import numpy; numpy.arange(10).sum()`: warm interpreter vs cold -c"

TARGET_RATIO = 0.10
"""warm / cold, ratio of medians (issue 44 item 2)."""
CODE = "import numpy; numpy.arange(10).sum()"
COLD_CODE = "import numpy; print(numpy.arange(10).sum())"
PRELOAD = ("numpy", "pandas")
ROUND_COUNTS = common.RoundCounts(rounds=20, warmup=2, quick_rounds=5, quick_warmup=1)
BENCH_LABEL = "sbxkit.bench-warm-interpreter"
LABELS = {
    "cold": "cold: sbxkit.run of python3 -c, to its first output",
    "warm": "warm: pool.interpreter() + run_code, to its result",
}


def default_pydata() -> str:
    return os.environ.get("SBXKIT_TEST_PYDATA_IMAGE", "sbxkit-test/pydata:latest")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(parser, ROUND_COUNTS, default_order="cold,warm (alternating)")
    parser.add_argument("--socket", default=default_socket(), help="daemon socket")
    parser.add_argument("--image", default=default_pydata(), help="image with numpy (local)")
    common.add_out_argument(parser, "warm_interpreter.json / .md")


def spec(image: str, command: list[str]) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=command,
        limits=Limits(cpus=1.0, memory_bytes=512 * MiB, pids=64, output_bytes=MiB, timeout_s=60),
        labels={BENCH_LABEL: NAME},
    )


async def cold(engine: Engine, image: str) -> float:
    """Seconds from the call to the first output of a cold ``python3 -c``."""
    first: list[float] = []

    def seen(stream: Stream, chunk: bytes) -> None:
        if stream == "stdout" and not first:
            first.append(time.perf_counter())

    t0 = time.perf_counter()
    result = await run(
        spec(image, ["python3", "-c", COLD_CODE]),
        engine=engine,
        on_output=seen,
    )
    if result.status != "exited" or result.exit_code != 0 or result.stdout != b"45\n":
        raise RuntimeError(f"cold: {result.status} {result.exit_code} {result.stderr[-300:]!r}")
    return first[0] - t0


async def warm(pool: InterpreterPool) -> float:
    """Seconds from the claim to the returned result of ``CODE`` (a parked one waits)."""
    await pool.wait_ready(1)  # untimed: the pool parks ahead of time
    t0 = time.perf_counter()
    async with pool.interpreter() as interp:
        result = await interp.run_code(CODE)
        elapsed = time.perf_counter() - t0
        if not interp.warm:
            raise RuntimeError("warm: the claim went cold")
    if result.text != "np.int64(45)":
        raise RuntimeError(f"warm: {result.status} {result.text!r} {result.error!r}")
    return elapsed


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    witness = RawEngine(args.socket)
    errors: list[str] = []
    samples: dict[str, list[float]] = {"cold": [], "warm": []}
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await common.require_image(engine, args.image, NAME)
        say(f"{NAME}: {warmup} warm-up + {rounds} measured rounds of cold and warm, alternating")
        try:
            async with open_interpreter_pool(
                spec(args.image, ["unused"]), size=2, preload=PRELOAD, engine=engine
            ) as pool:
                await pool.wait_ready()
                for round_no in range(-warmup, rounds):
                    order = ("cold", "warm") if round_no % 2 == 0 else ("warm", "cold")
                    for key in order:
                        took = await (cold(engine, args.image) if key == "cold" else warm(pool))
                        if round_no >= 0:
                            samples[key].append(took)
                claims = dict(pool.claims)
        except Exception as exc:  # a failing contender is the run's error, reported
            errors.append(f"{type(exc).__name__}: {exc}")
            claims = {}
    leaks = await trio.to_thread.run_sync(witness.containers, f"{BENCH_LABEL}={NAME}")
    witness.close()
    facts["loadavg_at_end"] = list(os.getloadavg())
    complete = not errors and all(len(v) == rounds for v in samples.values())
    ratio = (
        statistics.median(samples["warm"]) / statistics.median(samples["cold"])
        if complete
        else None
    )
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": warmup,
            "image": args.image,
            "code": CODE,
            "preload": list(PRELOAD),
            "claims": claims,
            "limits": msgspec.to_builtins(spec(args.image, ["unused"]).limits),
        },
        "contenders": {
            key: {"label": LABELS[key], "total_ms": summarise_ms(v)} for key, v in samples.items()
        },
        "samples_ms": {key: [round(s * 1000, 2) for s in v] for key, v in samples.items()},
        "target": common.at_most_target(f"warm/cold <= {TARGET_RATIO:.2f}", ratio, TARGET_RATIO),
        "errors": errors,
        "leaks": [{"id": c["Id"][:12], "names": c.get("Names")} for c in leaks],
        "ok": complete and not leaks,
        "lease_label": LEASE_LABEL,
    }


def render_text(report: dict[str, Any]) -> str:
    lines = [f"{NAME} — {report['config']['rounds']} rounds (+{report['config']['warmup']})"]
    for key, info in report["contenders"].items():
        ms = info["total_ms"]
        if ms.get("n"):
            lines.append(
                f"  {key:<5} median {ms['median']:8.1f} ms  p10 {ms['p10']:8.1f}  "
                f"p90 {ms['p90']:8.1f}"
            )
    lines += common.target_lines(report["target"])
    return "\n".join(lines + common.errors_text(report))


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# {NAME} — time to the first numpy result, warm vs cold",
        "",
        f"{m['date']} · {cfg['rounds']} measured rounds (+{cfg['warmup']} warm-up), cold and "
        f"warm alternating · `{cfg['image']}` · "
        + common.docker_md(m, runtime=m["default_runtime"], kernel=True)
        + common.git_md(m),
        "",
        *common.ms_table_md(report["contenders"]),
    ]
    out += common.target_md(report["target"])
    return common.md(out + common.errors_md(report))


def main(args: argparse.Namespace) -> int:
    rounds, warmup = common.rounds_and_warmup(args, NAME, ROUND_COUNTS)
    report = trio.run(measure, args, rounds, warmup)
    print(render_text(report))
    common.write_report(args.out, NAME, report, render_markdown)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
