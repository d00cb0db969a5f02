"""``sbxkit run [options] IMAGE -- CMD...``: one command in a fresh sandbox, then removed."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import Any, NamedTuple

import msgspec
import trio

from sbxkit._grammar.backend_choice import cli_backend
from sbxkit._grammar.common import cancel_on_signals, exit_code_for, to_json
from sbxkit._grammar.docker_habits import INSTEAD, add_docker_flags
from sbxkit._grammar.flags import (
    DEFAULTS,
    ImageAndCommand,
    add_kind_flags,
    add_sandbox_flags,
    flags_in_errors,
    image_usage,
    spec_from_args,
)
from sbxkit._grammar.profile import PoolOptions, Profile, load_profile, profile_settings
from sbxkit._grammar.result_doc import OUTPUT_ENCODINGS, OutputEncoding
from sbxkit._model.call_checks import MAX_POOL_SIZE
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec, writable_image
from sbxkit._model.units import format_seconds, format_size
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.notice import WaitingNotice, say
from sbxkit._util.stdin import FileStdin, StdinSource
from sbxkit._util.unwrap import plain_async
from sbxkit.backends.base import Backend, open_backend
from sbxkit.engine.client import open_engine
from sbxkit.errors import ImageError, NotFound, SpecError


class RunBounds(NamedTuple):
    """The limits a run had, as its verdict line names them (None: not known here)."""

    timeout_s: float | None = None
    output_bytes: int | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None


NO_BOUNDS = RunBounds()


def stdin_carries_data() -> bool:
    """True when this process's stdin is a pipe or a regular file (not a terminal, not
    /dev/null, not closed): bytes someone meant for somebody."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def stdin_of(source: str | None, *, streamed: bool) -> StdinSource | None:
    """``--stdin -`` is ours, ``--stdin FILE`` a file, ``--stdin none`` nothing. Without the
    flag, a piped stdin is refused rather than dropped or read: reading an inherited pipe
    (a script's loop, a CI runner) would swallow someone else's input or block forever.

    ``streamed`` (the Docker backend): a stream read as the payload takes it, opened inside the
    run, so a FIFO or ``/dev/zero`` is bounded by the run's time limit and a large file costs
    one chunk of memory. Otherwise (the sbx runtime takes bytes) the file is read here, whole.
    """
    if source is None:
        if stdin_carries_data():
            raise SpecError(
                "--stdin",
                "stdin is a pipe or a file: pass --stdin - to send it to the payload, or "
                "--stdin none to ignore it (e.g. a script's inherited stdin)",
            )
        return None
    if source == "none":
        return None
    if streamed:
        if source == "-":
            return FileStdin(fd=os.dup(sys.stdin.fileno()), field="--stdin")
        return FileStdin(source, field="--stdin")
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise SpecError("--stdin", f"cannot read {source}: {exc.strerror}") from None


@plain_async
async def run_interruptibly(
    backend: Backend, spec: SandboxSpec | CheckedSpec, stdin: StdinSource | None
) -> RunResult:
    """Preflight, reconcile, run once and close ``backend``, with SIGINT/SIGTERM turned into
    trio cancellation, so removal runs shielded to completion (a KeyboardInterrupt raised
    mid-cleanup could otherwise cut it short)."""

    async def once() -> RunResult:
        async with open_backend(backend):
            return await backend.run_once(spec, stdin)

    return await cancel_on_signals(once)


def cmd_run(args: argparse.Namespace) -> int:
    take_docker_stdin(args)
    profile = load_profile(args.profile) if args.profile is not None else None
    spec = spec_from_args(args, profile)
    if not spec.command:  # docker's habit: the image's own Entrypoint and Cmd
        spec = msgspec.structs.replace(
            spec, command=trio.run(image_command, args.socket, spec.image)
        )
    settings = profile_settings(profile)[0] if profile is not None else None
    on_queued = WaitingNotice(sys.stderr) if sys.stderr.isatty() else None
    backend = cli_backend(
        profile,
        socket_path=args.socket,
        settings=settings,
        on_queued=on_queued,
        pool=run_pool(args, profile),
    )
    with flags_in_errors(args):
        checked = backend.check(spec, "run")  # refused input never waits for stdin
    stdin = stdin_of(args.stdin, streamed=backend.kind == "docker")
    result = trio.run(run_interruptibly, backend, checked, stdin)
    return print_result(
        result, json=args.json, bounds=bounds_of(checked), encoding=args.output_encoding
    )


def print_result(
    result: RunResult,
    *,
    json: bool,
    bounds: RunBounds = NO_BOUNDS,
    encoding: OutputEncoding = "utf-8",
) -> int:
    """Print a result as ``sbxkit run`` does (the payload's streams, or one JSON object) and
    return its exit status; the verdict line names the limits of ``bounds``."""
    if json:
        sys.stdout.buffer.write(to_json(result, encoding) + b"\n")
    else:
        sys.stdout.buffer.write(result.stdout)
        sys.stderr.buffer.write(result.stderr)
        notice = status_notice(result, bounds)
        if notice is not None:
            say(notice, sys.stderr)
    sys.stdout.flush()
    return exit_code_for(result)


def take_docker_stdin(args: argparse.Namespace) -> None:
    """``-i`` is ``--stdin -``; ``-t`` is refused (no terminal here)."""
    if getattr(args, "tty", False):
        raise SpecError("-t", INSTEAD["-t"])
    if getattr(args, "interactive", False):
        if args.stdin not in (None, "-"):
            raise SpecError("-i", f"and --stdin {args.stdin}: name one source of stdin")
        args.stdin = "-"


async def image_command(socket_path: str | None, image: str) -> list[str]:
    """The image's ``Entrypoint`` then ``Cmd``, as docker runs an image given no command."""
    async with open_engine(socket_path) as engine:
        try:
            config = (await engine.image_inspect(image)).config
        except NotFound:
            raise ImageError(image, "not present locally; sbxkit never pulls images") from None
    command = [*(config.entrypoint or []), *(config.cmd or [])] if config else []
    if not command:
        raise SpecError("CMD", f"none given, and the image {image} has no Entrypoint or Cmd")
    return command


def bounds_of(spec: SandboxSpec | CheckedSpec) -> RunBounds:
    """The limits of ``spec`` a verdict line names."""
    spec = spec.spec if isinstance(spec, CheckedSpec) else spec
    limits = spec.limits
    return RunBounds(
        timeout_s=limits.timeout_s,
        output_bytes=limits.output_bytes,
        memory_bytes=limits.memory_bytes,
        disk_bytes=writable_image(spec),
    )


def status_notice(result: RunResult, bounds: RunBounds = NO_BOUNDS) -> str | None:
    """What ``sbxkit run`` says on stderr after the payload's own, when it did not simply
    exit, naming the limit that ended it: ``sbxkit: timed out after 30 s``, ``sbxkit: output
    exceeded (stdout): limit 1 MiB``, ``sbxkit: oom killed: memory limit 256 MiB`` ..."""
    if result.status == "exited":
        return None
    line = f"sbxkit: {result.status.replace('_', ' ')}"
    if result.overflowed:
        line += f" ({result.overflowed})"
    if result.status == "timed_out" and bounds.timeout_s is not None:
        return f"{line} after {format_seconds(bounds.timeout_s)}"
    limit = {
        "output_exceeded": ("limit", bounds.output_bytes),
        "oom_killed": ("memory limit", bounds.memory_bytes),
        "disk_exceeded": ("disk limit", bounds.disk_bytes),
    }.get(result.status)
    if limit is not None and limit[1] is not None:
        return f"{line}: {limit[0]} {format_size(limit[1])}"
    return line


def run_pool(args: argparse.Namespace, profile: Profile | None) -> PoolOptions | None:
    """``--pool N``, else the profile's ``[sandbox.docker.pool]``: the supervisor's pool of
    this run's shape to claim from (docs/pool.md); None runs cold."""
    if args.pool is not None:
        size = args.pool
        if not (size.isascii() and size.isdigit()) or not 1 <= int(size) <= MAX_POOL_SIZE:
            raise SpecError("--pool", f"must be an integer from 1 to {MAX_POOL_SIZE}")
        configured = profile.sandbox.docker.pool if profile is not None else None
        if configured is not None:
            return msgspec.structs.replace(configured, size=int(size))
        return PoolOptions(size=int(size))
    return profile.sandbox.docker.pool if profile is not None else None


def add_output_encoding(parser: argparse.ArgumentParser) -> None:
    """``--output-encoding``: how JSON carries the payload's output (``run --json``, batch)."""
    parser.add_argument(
        "--output-encoding",
        choices=OUTPUT_ENCODINGS,
        default="utf-8",
        help="utf-8 (default): stdout and stderr as text, a byte that is not UTF-8 replaced by "
        "U+FFFD; base64: stdout_base64 and stderr_base64, the bytes exactly",
    )


def add_run_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run one command in a fresh sandbox, then remove it",
        usage=image_usage("run", " -- CMD..."),
        epilog="exit status: the payload's own when it exited; 124 timed out; 123 output "
        "exceeded; 137 OOM-killed; 2 refused input; 69 engine unavailable; "
        "74 cleanup failed; 75 capacity; 70 other error",
    )
    add_sandbox_flags(
        parser,
        DEFAULTS,
        profile_help="TOML profile ([sandbox.docker]) supplying defaults; flags override it; "
        '[sandbox] runtime = "sandbox" runs the command in an sbx microVM instead',
        output_help="bytes kept per stream; one more is 'output exceeded'",
        timeout_help="elapsed-time limit",
        network_help="none (default; --allow and --callback govern its egress), or bridge or "
        "managed: routed, refused in production",
    )
    parser.add_argument(
        "--stdin",
        metavar="FILE|-|none",
        help="feed a file, - (this stdin) or none; a piped stdin needs this flag",
    )
    add_kind_flags(parser)
    add_docker_flags(parser, stdin=True)
    parser.add_argument(
        "--pool",
        metavar="N",
        help="claim a pre-started container from the supervisor's pool of this run's shape, "
        "kept N strong (the first run of a shape starts the pool; docs/pool.md)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_output_encoding(parser)
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, action=ImageAndCommand, metavar="IMAGE -- CMD"
    )
    parser.set_defaults(handler=cmd_run)
    return parser
