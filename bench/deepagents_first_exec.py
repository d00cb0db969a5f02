"""Time to a deep agent's first command: sbxkit's backend against deep agents' own.

``python -m bench.deepagents_first_exec [--rounds N] [--image IMAGE]`` (needs the
``deepagents`` extra; not in ``python -m bench``'s list, which runs without it). Interleaved
rounds, each timing from making the backend to the answer of its first ``execute("true")``:

``local_shell``
    deep agents' ``LocalShellBackend`` (``subprocess.run(shell=True)`` on the host: no
    isolation at all, the backend deep agents ships for ``execute``).
``sbxkit``
    ``SbxkitSandbox(image=IMAGE)``: the supervised, hardened sandbox opened (root inside a
    remapped user namespace, the image writable under its disk bound), then the command.
    Its ``close()`` (the container removed) is timed apart, as ``sbxkit_close``.

The ratio is sbxkit / local_shell, of medians from the same run. Nothing is asserted:
benchmarks measure, tests assert. The daemon must allow the default workspace (a userns-remap
daemon, rootless, or gVisor): ``SBXKIT_USERNS_NAME=NAME bash scripts/userns-engine-up``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from deepagents.backends import LocalShellBackend

from sbxkit.integrations.deepagents import SbxkitSandbox

RESULTS = Path(__file__).parent / "results" / "deepagents_first_exec.json"


def local_shell(workdir: str) -> float:
    started = time.perf_counter()
    backend = LocalShellBackend(root_dir=workdir, virtual_mode=False)
    result = backend.execute("true")
    elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(f"local_shell: {result}")
    return elapsed


def sbxkit(image: str) -> tuple[float, float]:
    started = time.perf_counter()
    backend = SbxkitSandbox(image=image)
    try:
        result = backend.execute("true")
        elapsed = time.perf_counter() - started
    finally:
        closing = time.perf_counter()
        backend.close()
    if result.exit_code != 0:
        raise SystemExit(f"sbxkit: {result}")
    return elapsed, time.perf_counter() - closing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--image", default="sbxkit-test/python:latest")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {"local_shell": [], "sbxkit": [], "sbxkit_close": []}
    with tempfile.TemporaryDirectory(prefix="bench-deepagents-") as workdir:
        for round_no in range(args.warmup + args.rounds):
            shell = local_shell(workdir)
            first, close = sbxkit(args.image)
            if round_no >= args.warmup:
                times["local_shell"].append(shell)
                times["sbxkit"].append(first)
                times["sbxkit_close"].append(close)
    medians = {name: statistics.median(values) for name, values in times.items()}
    report = {
        "rounds": args.rounds,
        "warmup": args.warmup,
        "image": args.image,
        "docker_host": os.environ.get("DOCKER_HOST", ""),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_1m_after": round(os.getloadavg()[0], 2),  # a shared machine says so here
        },
        "median_ms": {name: round(value * 1000, 2) for name, value in medians.items()},
        "ratio_sbxkit_to_local_shell": round(medians["sbxkit"] / medians["local_shell"], 1),
        "samples_ms": {
            name: [round(v * 1000, 2) for v in values] for name, values in times.items()
        },
    }
    for name, value in report["median_ms"].items():  # type: ignore[attr-defined]
        print(f"{name:>12}: median {value:8.2f} ms over {args.rounds} rounds")
    print(f"sbxkit / local_shell: {report['ratio_sbxkit_to_local_shell']}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
