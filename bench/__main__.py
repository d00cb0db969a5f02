"""``python -m bench [NAME] [options]``: run one benchmark, or every registered one.

Without a name, every benchmark runs in registration order with the same options (so
``python -m bench --quick`` is a smoke run of all of them). The exit status is non-zero if any
benchmark failed to measure (a contender errored or a container leaked), never because a
target was missed: benchmarks measure, tests assert.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench import (
    cancel_latency,
    client_memory,
    cluster,
    cluster_parallel,
    concurrent_cli,
    cpu,
    exec_latency,
    humaneval,
    network,
    oneshot,
    pool,
    runtimes,
    streaming,
    supervised,
    throughput,
    waiting,
    warm_interpreter,
)
from bench.suite import RUN_LABEL


@dataclass(frozen=True)
class Benchmark:
    name: str
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    main: Callable[[argparse.Namespace], int]


BENCHMARKS: dict[str, Benchmark] = {
    module.NAME: Benchmark(module.NAME, module.SUMMARY, module.add_arguments, module.main)
    for module in (
        oneshot,
        supervised,
        exec_latency,
        throughput,
        concurrent_cli,
        streaming,
        cancel_latency,
        client_memory,
        humaneval,
        cpu,
        runtimes,
        pool,
        cluster,
        cluster_parallel,
        network,
        warm_interpreter,
        waiting,
    )
}
"""Registered benchmarks, by name; add new modules to the tuple above."""


def _parser(bench: Benchmark) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog=f"python -m bench {bench.name}", description=bench.summary
    )
    bench.add_arguments(parser)
    return parser


def usage() -> str:
    lines = [
        "usage: python -m bench [NAME] [options]   (no NAME: run all)",
        "       python -m bench NAME --help",
        "",
        "benchmarks:",
    ]
    lines += [f"  {b.name:<12} {b.summary}" for b in BENCHMARKS.values()]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if args and args[0] in ("-h", "--help", "help", "list"):
        print(usage())
        return 0
    if args and not args[0].startswith("-"):
        name = args.pop(0)
        if name not in BENCHMARKS:
            print(f"unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
            return 2
        selected = [BENCHMARKS[name]]
    else:
        selected = list(BENCHMARKS.values())
    # A bench run is a session of its own on a daemon a test suite may share: without a run
    # label of its own, the suite's witness takes its sandboxes for the suite's leaks and
    # removes them mid-run. Under the suite (SBXKIT_LABELS already set) the suite's stays.
    os.environ.setdefault("SBXKIT_LABELS", f"{RUN_LABEL}=bench-{secrets.token_hex(4)}")
    status = 0
    for bench in selected:
        status = max(status, bench.main(_parser(bench).parse_args(args)))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
