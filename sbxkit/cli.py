"""``sbxkit`` command line: ``run`` one sandboxed command, or ``demo`` the limits holding.

Exit codes (also in README and docs/cli.md):
  the payload's own code when it exited normally (0–255);
  124 timed out; 123 output exceeded; 137 OOM-killed;
  2 refused input (bad flag or spec, image missing or refused);
  69 engine unavailable; 74 cleanup failed (the lease is kept); 70 any other sbxkit error.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import msgspec
import trio

from sbxkit.backends.base import Backend, open_backend
from sbxkit.errors import (
    CleanupError,
    EngineUnavailable,
    ImageError,
    SbxError,
    SpecError,
)
from sbxkit.gpu import GpuRequest
from sbxkit.jobs import LIMIT_FLAGS
from sbxkit.profile import (
    Profile,
    apply_profile,
    load_profile,
    profile_settings,
    sandbox_options,
    supervisor_command,
)
from sbxkit.result import RunResult, Status, json_fields
from sbxkit.runner import run
from sbxkit.settings import Settings
from sbxkit.spec import Limits, SandboxSpec, check_limit, parse_size
from sbxkit.unwrap import plain_async

EXIT_REFUSED = 2
EXIT_OUTPUT_EXCEEDED = 123
EXIT_TIMED_OUT = 124
EXIT_OOM_KILLED = 137
EXIT_ENGINE_UNAVAILABLE = 69
EXIT_INTERNAL = 70
EXIT_CLEANUP_FAILED = 74
EXIT_SIGINT = 128 + signal.SIGINT

STATUS_EXIT: dict[Status, int] = {
    "timed_out": EXIT_TIMED_OUT,
    "output_exceeded": EXIT_OUTPUT_EXCEEDED,
    "oom_killed": EXIT_OOM_KILLED,
    "killed": EXIT_OOM_KILLED,  # 128 + SIGKILL as well: --json's status says which
}

DEFAULTS = {"cpus": "1", "memory": "256m", "pids": "128", "max_output": "1m", "timeout": "30"}


class JsonResult(msgspec.Struct, kw_only=True):
    """The ``--json`` document: one object, text decoded as UTF-8 with replacement."""

    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    overflowed: str | None
    container_id: str
    lease: str
    oom_evidence: str | None
    kill_evidence: str | None
    usage: dict[str, object] | None
    timings: dict[str, float]


def to_json(result: RunResult) -> bytes:
    doc = JsonResult(**json_fields(result))  # type: ignore[arg-type]
    return msgspec.json.encode(doc)


def exit_code_for(result: RunResult) -> int:
    if result.status == "exited":
        return result.exit_code if result.exit_code is not None else EXIT_INTERNAL
    return STATUS_EXIT[result.status]


def exit_code_for_error(error: SbxError) -> int:
    if isinstance(error, SpecError | ImageError):
        return EXIT_REFUSED
    if isinstance(error, EngineUnavailable):
        return EXIT_ENGINE_UNAVAILABLE
    if isinstance(error, CleanupError):
        return EXIT_CLEANUP_FAILED
    return EXIT_INTERNAL


def _number(text: str, field: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        raise SpecError(field, f"expected a number, got {text!r}") from None


def _env(pairs: Sequence[str]) -> dict[str, str]:
    """``K=V`` sets a value; a bare ``K`` passes the host's value, by name only."""
    env: dict[str, str] = {}
    for item in pairs:
        key, eq, value = item.partition("=")
        if not eq:
            if key not in os.environ:
                raise SpecError(f"--env {key}", "bare names pass the host value, but it is unset")
            value = os.environ[key]
        env[key] = value
    return env


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    """``--label K=V``; the value may be empty, the key may not."""
    labels: dict[str, str] = {}
    for item in pairs:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SpecError(f"--label {item}", "expected KEY=VALUE")
        labels[key] = value
    return labels


def _gpus(text: str) -> GpuRequest:
    """``--gpus N`` asks for N GPUs chosen round-robin; ``--gpus ID[,ID...]`` names CDI devices."""
    stripped = text.strip()
    if stripped.isdigit():
        return GpuRequest(count=int(stripped))
    return GpuRequest(devices=[part.strip() for part in stripped.split(",")])


# (argparse dest, flag, Limits field, parser): the limits a flag sets; sizes use parse_size.
_LIMIT_FLAGS = LIMIT_FLAGS


def limit_value(text: str, flag: str, kind: str) -> int | float:
    """A limit flag's value: sizes as ``parse_size`` reads them, numbers as Python does."""
    if kind == "size":
        return parse_size(text, flag)
    if kind == "int":
        return int(_number(text, flag, int))
    return _number(text, flag, float)


def check_limit_flag(field: str, value: int | float, flag: str, text: str) -> None:
    """Refuse a flag's bad limit naming the flag (``--memory``), not the spec field."""
    try:
        check_limit(field, value, flag)
    except SpecError as exc:
        if text.strip().isdigit() and int(text) > 0 and field.endswith("_bytes"):
            hint = f"{exc.rule}; a bare number is bytes (did you mean {text.strip()}m?)"
            raise SpecError(flag, hint) from None
        raise


def spec_from_args(
    args: argparse.Namespace,
    profile: Profile | None = None,
    *,
    defaults: Mapping[str, str] = DEFAULTS,
    default_command: Sequence[str] = (),
) -> SandboxSpec:
    """The spec the flags describe: a profile's values are defaults, explicit flags win, and
    ``defaults`` fill any mandatory limit neither set. Shared by ``run`` and ``shell``; flags a
    command does not define count as not given."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    command = command or list(default_command)
    if profile is not None:
        base, _, _ = apply_profile(profile, command, image=args.image)
    else:
        if args.image is None:
            raise SpecError("IMAGE", "required (or --profile FILE naming an image)")
        # Partial on purpose: the flags and defaults below fill the mandatory limits.
        base = SandboxSpec(image=args.image, command=command, limits=msgspec.convert({}, Limits))
    limits: dict[str, Any] = {}
    for dest, flag, field, kind in _LIMIT_FLAGS:
        given = getattr(args, dest)
        if given is not None:
            limits[field] = limit_value(given, flag, kind)
            check_limit_flag(field, limits[field], flag, given)
        elif getattr(base.limits, field) is None and dest in defaults:
            limits[field] = limit_value(defaults[dest], flag, kind)
    overrides: dict[str, Any] = {
        "limits": msgspec.structs.replace(base.limits, **limits),
        "env": {**base.env, **_env(getattr(args, "env", None) or [])},
        "labels": {**base.labels, **_labels(getattr(args, "label", None) or [])},
    }
    if getattr(args, "user", None):
        overrides["user"] = args.user
    for dest in ("workdir", "runtime", "network"):
        if getattr(args, dest, None) is not None:
            overrides[dest] = getattr(args, dest)
    if getattr(args, "gpus", None) is not None:
        overrides["gpus"] = _gpus(args.gpus)
    return msgspec.structs.replace(base, **overrides)


def stdin_carries_data() -> bool:
    """True when this process's stdin is a pipe or a regular file (not a terminal, not
    /dev/null, not closed): bytes someone meant for somebody."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _read_stdin(source: str | None) -> bytes | None:
    """``--stdin -`` reads ours, ``--stdin FILE`` a file, ``--stdin none`` nothing. Without the
    flag, a piped stdin is refused rather than dropped or read: reading an inherited pipe
    (a script's loop, a CI runner) would swallow someone else's input or block forever."""
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
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise SpecError("--stdin", f"cannot read {source}: {exc.strerror}") from None


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; the sandbox was removed before this was raised."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


@plain_async
async def run_interruptibly(
    spec: SandboxSpec,
    stdin: bytes | None,
    socket_path: str | None,
    settings: Settings | None = None,
    backend: Backend | None = None,
) -> RunResult:
    """Turn SIGINT/SIGTERM into trio cancellation, so removal runs shielded to completion
    (a KeyboardInterrupt raised mid-cleanup could otherwise cut it short).

    Without ``backend`` this is ``sbxkit.runner.run``, as it always was; with one (the sandbox
    runtime) the backend is preflighted, reconciled, used once and closed."""
    received: list[int] = []
    result: RunResult | None = None
    error: SbxError | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    received.append(signum)
                    nursery.cancel_scope.cancel()
                    return

            async def work() -> None:
                # Caught here, not around the nursery: trio would wrap it in an ExceptionGroup.
                nonlocal result, error
                try:
                    if backend is None:
                        result = await run(spec, stdin, socket_path=socket_path, settings=settings)
                    else:
                        async with open_backend(backend):
                            result = await backend.run_once(spec, stdin)
                except SbxError as exc:
                    error = exc
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(work)
    if error is not None:
        raise error
    if result is None and received:
        raise Interrupted(received[0])
    assert result is not None
    return result


def cmd_run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile) if args.profile is not None else None
    spec = spec_from_args(args, profile)
    settings: Settings | None = None
    backend: Backend | None = None
    if profile is not None and sandbox_options(profile) is not None:
        backend = sandbox_backend(profile, args, spec)
    elif profile is not None:
        settings, supervisor = profile_settings(profile)
        command = supervisor_command(supervisor)
        if command is not None:
            # The supervisor client reads SBXKIT_SUPERVISOR when it launches the helper; this
            # process is the CLI's own, so setting it here affects this run only.
            os.environ["SBXKIT_SUPERVISOR"] = command
    stdin = _read_stdin(args.stdin)
    result = trio.run(run_interruptibly, spec, stdin, args.socket, settings, backend)
    if args.json:
        sys.stdout.buffer.write(to_json(result) + b"\n")
    else:
        sys.stdout.buffer.write(result.stdout)
        sys.stderr.buffer.write(result.stderr)
        if result.status != "exited":
            detail = f" ({result.overflowed})" if result.overflowed else ""
            print(f"sbxkit: {result.status.replace('_', ' ')}{detail}", file=sys.stderr)
    sys.stdout.flush()
    return exit_code_for(result)


def sandbox_backend(profile: Profile, args: argparse.Namespace, spec: SandboxSpec) -> Backend:
    """The sbx microVM runner a ``runtime = "sandbox"`` profile selects (docs/adr-sbx.md),
    after refusing what it cannot honour (flags included) before any ``sbx`` command runs."""
    from sbxkit.backends.sbx import SbxBackend, SbxConfig, check_sbx_spec

    options = sandbox_options(profile)
    assert options is not None
    if args.socket is not None:
        raise SpecError("--socket", 'a Docker socket has no meaning under runtime = "sandbox"')
    check_sbx_spec(spec)
    config = SbxConfig(
        binary=options.binary,
        agent=options.agent,
        kits=list(options.kits),
        create_args=list(options.create_args),
    )
    return SbxBackend(config)


def cmd_demo(args: argparse.Namespace) -> int:
    from sbxkit.demo import main as demo_main

    return demo_main(image=args.image, socket_path=args.socket)


def cmd_supervisor(args: argparse.Namespace) -> int:
    from sbxkit.supervisor.service import config_from_args, serve

    return trio.run(serve, config_from_args(args))


def cmd_leases(args: argparse.Namespace) -> int:
    from sbxkit.supervisor import admin
    from sbxkit.supervisor.journal import default_state_dir

    state_dir = args.state_dir or default_state_dir()
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


class _ImageAndCommand(argparse.Action):
    """Split what follows the options into IMAGE and CMD.

    ``IMAGE CMD...`` as always (everything after IMAGE belongs to the command, a leading
    ``--`` included and stripped later); ``-- CMD...`` with no IMAGE is accepted only with
    ``--profile``, whose profile supplies the image. Options all precede this positional
    (it swallows everything), so ``--profile`` is known when this runs.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        rest = [str(v) for v in values or []]
        image: str | None = None
        if rest and rest[0] != "--":
            image, rest = rest[0], rest[1:]
        if image is None and namespace.profile is None:
            raise argparse.ArgumentError(
                self, "IMAGE is required (or --profile FILE whose profile names an image)"
            )
        namespace.image = image
        namespace.command = rest


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under ``--json`` is also one JSON object on stdout."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            print_json_error("UsageError", message, None, EXIT_REFUSED)
        super().error(message)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("sbxkit")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sbxkit", description="Run untrusted commands in hardened Docker sandboxes."
    )
    parser.add_argument("--version", action="version", version=f"sbxkit {version()}")
    # Subcommands are Parsers too (argparse uses the parent's class), typed as the base class.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="action", required=True),
    )

    p_run = sub.add_parser(
        "run",
        help="run one command in a fresh sandbox, then remove it",
        usage="sbxkit run [options] IMAGE -- CMD...\n"
        "       sbxkit run --profile FILE [options] [IMAGE] -- CMD...",
        epilog="exit status: the payload's own when it exited; 124 timed out; 123 output "
        "exceeded; 137 OOM-killed; 2 refused input; 69 engine unavailable; "
        "74 cleanup failed; 70 other error",
    )
    p_run.add_argument(
        "--profile",
        metavar="FILE",
        help="TOML profile ([sandbox.docker]) supplying defaults; flags override it; "
        '[sandbox] runtime = "sandbox" runs the command in an sbx microVM instead',
    )
    p_run.add_argument("--cpus", help=f"CPU quota (default: {DEFAULTS['cpus']})")
    p_run.add_argument("--memory", help=f"memory ceiling, no swap (default: {DEFAULTS['memory']})")
    p_run.add_argument("--pids", help=f"process count ceiling (default: {DEFAULTS['pids']})")
    p_run.add_argument(
        "--max-output",
        help="bytes kept per stream; one more is 'output exceeded' "
        f"(default: {DEFAULTS['max_output']})",
    )
    p_run.add_argument(
        "--timeout", help=f"elapsed-time limit in seconds (default: {DEFAULTS['timeout']})"
    )
    p_run.add_argument("--fsize", help="per-file size ceiling (default: 64m)")
    p_run.add_argument("--scratch", help="size of the /tmp tmpfs (default: 64m)")
    p_run.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable; a bare K passes the host's value",
    )
    p_run.add_argument(
        "--stdin",
        metavar="FILE|-|none",
        help="feed a file, - (this stdin) or none; a piped stdin needs this flag",
    )
    p_run.add_argument("--user", help="UID:GID, non-root (default: 65534:65534)")
    p_run.add_argument("--workdir", help="absolute working directory")
    p_run.add_argument(
        "--runtime",
        help="OCI runtime registered in the daemon; gvisor means runsc (default: runc)",
    )
    p_run.add_argument(
        "--network",
        choices=["none", "bridge"],
        help="none (default) or bridge: unrestricted egress, refused in production",
    )
    p_run.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="add a container label"
    )
    p_run.add_argument(
        "--gpus",
        metavar="N|CDI-ID[,...]",
        help="N GPUs chosen round-robin from the daemon's CDI devices, or explicit CDI names",
    )
    p_run.add_argument("--socket", help="Docker socket path (default: discovered)")
    p_run.add_argument("--json", action="store_true", help="print one JSON object")
    p_run.add_argument(
        "command", nargs=argparse.REMAINDER, action=_ImageAndCommand, metavar="IMAGE -- CMD"
    )
    p_run.set_defaults(handler=cmd_run)

    from sbxkit.supervisor.service import build_parser as supervisor_parser

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

    p_demo = sub.add_parser("demo", help="show the hardened defaults and limits holding")
    p_demo.add_argument("--image", default="sbxkit-test/busybox:latest")
    p_demo.add_argument("--socket", help="Docker socket path (default: discovered)")
    p_demo.set_defaults(handler=cmd_demo)
    from sbxkit.batch import add_batch_parser

    add_batch_parser(sub)
    from sbxkit.shell import add_shell_parser

    add_shell_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    options = argv[: argv.index("--")] if "--" in argv else argv
    Parser.json_errors = "--json" in options
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # a typo in a subcommand's flag: that subcommand's usage, not the top level's
        subcommand_parser(parser, args.action).error("unrecognized arguments: " + " ".join(unknown))
    exit_with(args.handler, args)


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    return parser


def print_json_error(kind: str, message: str, field: str | None, code: int) -> None:
    """``--json``'s answer on an error: one object, ``error`` set, on stdout."""
    doc = {"error": {"type": kind, "message": message, "field": field}, "exit_status": code}
    sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
    sys.stdout.flush()


def exit_with(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> NoReturn:
    """Run a subcommand's handler and exit with its status; errors become documented codes."""
    json_errors = bool(getattr(args, "json", False))
    try:
        code = handler(args)
    except SbxError as exc:
        print(f"sbxkit: error: {exc}", file=sys.stderr)
        code = exit_code_for_error(exc)
        if json_errors:
            print_json_error(type(exc).__name__, str(exc), getattr(exc, "field", None), code)
    except Interrupted as exc:
        print(f"sbxkit: interrupted by {exc}; sandbox removed", file=sys.stderr)
        code = exc.exit_code
        if json_errors:
            print_json_error("Interrupted", f"interrupted by {exc}", None, code)
    except KeyboardInterrupt:
        # A Ctrl-C outside trio's signal receiver: before the run began, or a repeated one
        # that trio redelivers once the receiver closes (after cleanup). No traceback.
        print("sbxkit: interrupted by SIGINT", file=sys.stderr)
        code = EXIT_SIGINT
    sys.exit(code)
