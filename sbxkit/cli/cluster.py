"""``sbxkit cluster resources``: what this host advertises to Ray as an sbxkit node (``DESCRIPTION``
is the ``--help`` text)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import trio

from sbxkit._model.spec import parse_size
from sbxkit._util.argtypes import positive_int
from sbxkit.cluster.resources import node_resources
from sbxkit.engine.client import open_engine
from sbxkit.supervisor.config import Capacity

DESCRIPTION = (
    "Prints the JSON for `ray start --resources`: the live sandboxes and the memory budget this "
    "host's supervisor admits (--max-workers and --memory-budget, as given to the supervisor; "
    "by default its own defaults, the memory budget from the engine's MemTotal). Ray then "
    "places each job of a cluster batch where that budget has room (docs/cluster.md)."
)


def add_cluster_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "cluster", help="this host as a node of a Ray cluster (docs/cluster.md)"
    )
    cluster_sub = parser.add_subparsers(dest="cluster_action", required=True)
    resources = cluster_sub.add_parser(
        "resources",
        help="print the JSON for `ray start --resources`: this host's supervisor budget",
        description=DESCRIPTION,
    )
    resources.add_argument("--socket", help="Docker socket path (default: discovered)")
    resources.add_argument(
        "--max-workers",
        type=positive_int,
        default=Capacity().max_workers,
        help="live sandboxes the supervisor admits (default: its default, "
        f"{Capacity().max_workers})",
    )
    resources.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="the supervisor's memory budget, e.g. 16g (default: the engine's MemTotal less "
        "the supervisor's headroom)",
    )
    resources.set_defaults(handler=cmd_cluster_resources)


def cmd_cluster_resources(args: argparse.Namespace) -> int:
    budget = (
        None if args.memory_budget is None else parse_size(args.memory_budget, "--memory-budget")
    )

    async def mem_total() -> int:
        async with open_engine(args.socket) as engine:
            return (await engine.info()).mem_total

    total = trio.run(mem_total) if budget is None else 0
    declared = node_resources(
        max_workers=args.max_workers, mem_total=total, memory_budget_bytes=budget
    )
    print(json.dumps(declared, sort_keys=True))
    return 0
