"""``sbxkit supervisor``, ``sbxkit leases``, ``sbxkit pools`` and ``sbxkit demo``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import trio

from sbxkit.errors import SpecError


def cmd_demo(args: argparse.Namespace) -> int:
    from sbxkit.cli.demo import main as demo_main

    return demo_main(image=args.image, socket_path=args.socket)


def cmd_supervisor(args: argparse.Namespace) -> int:
    from sbxkit.supervisor.config import config_from_args
    from sbxkit.supervisor.service import serve

    return trio.run(serve, config_from_args(args))


def cmd_leases(args: argparse.Namespace) -> int:
    from sbxkit._lifecycle import leases_admin as admin
    from sbxkit._protocol.journal import default_state_dir

    state_dir = args.state_dir or default_state_dir()
    if not os.path.lexists(state_dir):  # no supervisor ever ran here: nothing to show or do
        print(f"no lease records: {state_dir} does not exist (no supervisor has used it)")
        return 0
    if args.leases_action == "list":
        records, problems = admin.read_journal(state_dir)
        print("\n".join(admin.format_records(records)))
        for problem in problems:
            print(f"UNSAFE: {problem}")
        return 1 if problems else 0
    if args.leases_action == "retire" and not args.confirm:
        raise SpecError(
            "--confirm",
            "retiring deletes a tombstone for good: investigate the "
            "recorded daemon first, then pass --confirm",
        )
    if args.leases_action == "recover":
        report = admin.recover(state_dir)
    else:
        report = admin.retire(state_dir, args.lease)
    print("\n".join(report.lines) if report.lines else "nothing left to recover")
    print(f"records remaining: {report.remaining}")
    return 0


def cmd_pools(args: argparse.Namespace) -> int:
    """``pools list`` shows the supervisor's held pools; ``pools end SHAPE|--all`` ends them
    (their parked containers removed before it returns; claimed ones run on)."""
    from sbxkit._lifecycle import leases_admin as admin
    from sbxkit._protocol.journal import default_state_dir

    state_dir = args.state_dir or default_state_dir()
    if not os.path.lexists(state_dir):
        print(f"no pools are held: {state_dir} does not exist (no supervisor has used it)")
        return 0
    if args.pools_action == "list":
        held = admin.list_pools(state_dir)
        print("\n".join(admin.format_pools(held.pools)) if held.pools else "no pools are held")
        return 0
    if (args.shape is None) == (not args.all):
        raise SpecError("SHAPE", "name one pool's shape (as `sbxkit pools list` shows it) or --all")
    shape = args.shape.strip().lower() if args.shape is not None else None
    if shape is not None and not (shape and all(c in "0123456789abcdef" for c in shape)):
        raise SpecError(
            "SHAPE", f"a shape is hex digits, as `sbxkit pools list` shows, not {shape!r}"
        )
    ended = admin.end_pools(state_dir, shape)
    if ended.problem is not None:
        raise SpecError("SHAPE", ended.problem)
    for pool in ended.pools:
        print(f"ended pool {pool.shape[:12]} ({pool.image}): {pool.parked} parked removed")
    if not ended.pools:
        print("no pools are held")
    return 0


def add_admin_parsers(sub: Any) -> None:
    from sbxkit.supervisor.config import build_parser as supervisor_parser

    sub.add_parser(
        "supervisor",
        parents=[supervisor_parser()],
        add_help=False,
        help="run the lease supervisor (normally auto-launched)",
        description="Own sandbox creation and cleanup through a durable journal.",
    ).set_defaults(handler=cmd_supervisor)

    p_leases = sub.add_parser("leases", help="inspect and recover supervisor lease records")
    p_leases.add_argument(
        "--state-dir", type=Path, help="default: $SBXKIT_STATE_DIR or ~/.sbxkit/leases"
    )
    leases_sub = p_leases.add_subparsers(dest="leases_action", required=True)
    leases_sub.add_parser("list", help="show every record (read-only)")
    leases_sub.add_parser("recover", help="run a recovery pass now")
    p_retire = leases_sub.add_parser(
        "retire", help="delete an uncertain tombstone whose container was never observed"
    )
    p_retire.add_argument("lease")
    p_retire.add_argument("--confirm", action="store_true")
    p_leases.set_defaults(handler=cmd_leases)

    p_pools = sub.add_parser(
        "pools",
        help="list or end the pools of parked containers the supervisor holds (sbxkit run --pool)",
    )
    p_pools.add_argument(
        "--state-dir", type=Path, help="default: $SBXKIT_STATE_DIR or ~/.sbxkit/leases"
    )
    pools_sub = p_pools.add_subparsers(dest="pools_action", required=True)
    pools_sub.add_parser("list", help="one line per held pool: its shape, size, parked, claimed")
    p_end = pools_sub.add_parser(
        "end",
        help="end one shape's pool (every caller of that shape shares it) or all: parked "
        "containers are removed now, claimed ones run on",
    )
    p_end.add_argument("shape", nargs="?", metavar="SHAPE", help="a shape as `list` shows it")
    p_end.add_argument("--all", action="store_true", help="end every held pool")
    p_pools.set_defaults(handler=cmd_pools)

    p_demo = sub.add_parser("demo", help="show the hardened defaults and limits holding")
    p_demo.add_argument("--image", default="sbxkit-test/busybox:latest")
    p_demo.add_argument("--socket", help="Docker socket path (default: discovered)")
    p_demo.set_defaults(handler=cmd_demo)
