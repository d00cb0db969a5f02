"""Open sandboxes on the command line, as docker's ``run -d`` and ``exec`` go:

    sbxkit open --name work --workspace --disk 1g IMAGE      # prints: work
    sbxkit exec work -- make test                            # as sbxkit run prints it
    sbxkit exec -d work -- sh -c 'read x; echo "got $x"'     # prints: p3f2a...
    echo hi | sbxkit write --eof work p3f2a...               # its stdin
    sbxkit logs -f work p3f2a...                             # its output, as it comes
    sbxkit wait work p3f2a...                                # how it ended; its exit status
    sbxkit cp ./src work:/app/src ; sbxkit cp work:/app/out ./out
    sbxkit ps work ; sbxkit sessions ; sbxkit close work

``open`` checks its flags as ``sbxkit run`` does (refused input exits 2 before anything is
created), then starts a holder process (``_session_holder``) that keeps the sandbox open
through the supervisor and answers the other commands on a socket only this account can reach,
with a secret from a 0600 file. The sandbox is removed by ``close``, when its time limit
(``--timeout``, default 1h) passes, or when the holder is killed (then by the supervisor).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

import sbxkit.cli._session_client as client
import sbxkit.cli._session_wire as wire
from sbxkit._consumers.process_log import ProcessExit
from sbxkit._grammar.backend_choice import cli_backend
from sbxkit._grammar.common import EXIT_INTERNAL, exit_code_for
from sbxkit._grammar.flags import (
    ImageAndCommand,
    add_kind_flags,
    add_sandbox_flags,
    env_flags,
    flags_in_errors,
    image_usage,
    spec_from_args,
)
from sbxkit._grammar.profile import load_profile, profile_settings
from sbxkit._grammar.run_grammar import RunBounds, print_result, stdin_carries_data
from sbxkit._model.network_ports import PortForward, port_text
from sbxkit._model.units import parse_duration
from sbxkit._util.notice import say
from sbxkit.errors import SessionError, SpecError

OPEN_DEFAULTS = {
    "cpus": "1",
    "memory": "512m",
    "pids": "256",
    "max_output": "16m",
    "timeout": "1h",
}
"""An open sandbox lives for its ``--timeout`` and each command prints up to ``--max-output``
per stream (a background process: in all)."""
OPEN_WAIT_S = 300.0
READ_BYTES = 1024 * 1024
FOLLOW_WAIT_S = 1.0


# --- open --------------------------------------------------------------------------------------


def open_plan(args: argparse.Namespace, name: str) -> wire.OpenPlan:
    """The plan the flags make, checked by the backend that will run it: refusals come here,
    before a holder or a container exists."""
    profile_path = os.path.abspath(args.profile) if args.profile is not None else None
    profile = load_profile(profile_path) if profile_path is not None else None
    spec = spec_from_args(args, profile, defaults=OPEN_DEFAULTS)
    from sbxkit._consumers.session import keepalive_command  # only for open: a session's

    assert spec.limits.timeout_s is not None  # OPEN_DEFAULTS has one
    # What open_sandbox runs: the keep-alive, checked as the command it is.
    spec = msgspec.structs.replace(spec, command=keepalive_command(spec.limits.timeout_s))
    settings = profile_settings(profile)[0] if profile is not None else None
    backend = cli_backend(profile, socket_path=args.socket, settings=settings)
    with flags_in_errors(args):
        backend.check(spec, "session")
    files_root = args.files_root
    if files_root is None:  # a writable image is the workspace: files go anywhere in it
        writable = spec.workspace is not None and spec.workspace.disk_bytes is not None
        files_root = "/" if writable else "/tmp"
    return wire.OpenPlan(
        name=name, spec=spec, socket=args.socket, profile=profile_path, files_root=files_root
    )


def cmd_open(args: argparse.Namespace) -> int:
    given = args.command[1:] if args.command[:1] == ["--"] else args.command
    if given:
        raise SpecError(
            "open",
            f"takes an image, not a command ({' '.join(given)}): run commands with "
            "sbxkit exec NAME -- CMD",
        )
    name = wire.check_name(args.name, "--name") if args.name else "sb-" + secrets.token_hex(3)
    plan = open_plan(args, name)
    directory = client.sessions_directory(create=True)
    wire.socket_path(directory, name)  # too long a path is refused now, not in the holder
    record = client.read_record(directory, name)
    if record is not None:
        live = client.connect(record)
        if live is not None:
            live.close()
            raise SpecError("--name", f"a session named {name} is open (sbxkit close {name})")
        client.clear(directory, name)
    log = os.open(
        wire.log_path(directory, name),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
        0o600,
    )
    holder = subprocess.Popen(
        [sys.executable, "-m", "sbxkit.cli._session_holder"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        cwd="/",
        start_new_session=True,  # a Ctrl-C at this terminal later is not the holder's
    )
    os.close(log)
    assert holder.stdin is not None
    assert holder.stdout is not None
    try:
        holder.stdin.write(msgspec.json.encode(plan))
        holder.stdin.close()
        line = holder.stdout.readline()
    except BaseException:
        holder.terminate()  # it removes its sandbox before it exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            holder.wait(OPEN_WAIT_S)
        raise
    holder.stdout.close()
    try:
        report = json.loads(line) if line else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        holder.wait(OPEN_WAIT_S)
        raise SessionError(
            name,
            f"its holder exited ({holder.returncode}) without opening it; see "
            f"{wire.log_path(directory, name)}",
            code=EXIT_INTERNAL,
        )
    if not report.get("ok"):
        holder.wait(OPEN_WAIT_S)
        raise SessionError(
            name,
            str(report.get("message")),
            code=int(report.get("code") or EXIT_INTERNAL),
            field=report.get("field"),
        )
    ports = report.get("ports") or []
    if args.json:
        print(json.dumps({"name": name, "container_id": report["container_id"], "ports": ports}))
    else:
        print(name)
    for port in ports:  # the host side is a free port unless one was named
        print(f"sbxkit: {name} forwards {port_text(PortForward(**port))}", file=sys.stderr)
    return 0


# --- commands in it ----------------------------------------------------------------------------


def _seconds(text: str | None, flag: str) -> float | None:
    return None if text is None else parse_duration(text, flag)


def _input(source: str | None, field: str) -> bytes | None:
    """``--stdin``'s bytes (``-``, a file, ``none``), bounded; a piped stdin needs the flag,
    as for ``sbxkit run``."""
    if source is None:
        if stdin_carries_data():
            raise SpecError(
                field, "stdin is a pipe or a file: pass -i (--stdin -) to send it, or --stdin none"
            )
        return None
    if source == "none":
        return None
    try:
        if source == "-":
            data = sys.stdin.buffer.read(wire.MAX_INPUT_BYTES + 1)
        else:
            with open(source, "rb") as handle:
                data = handle.read(wire.MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise SpecError(field, f"cannot read {source}: {exc.strerror}") from None
    if len(data) > wire.MAX_INPUT_BYTES:
        raise SpecError(
            field,
            f"more than {wire.MAX_INPUT_BYTES} bytes in one call; put large inputs in with "
            "sbxkit cp",
        )
    return data


def _command(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SpecError("CMD", "missing: sbxkit exec NAME -- CMD...")
    return command


def cmd_exec(args: argparse.Namespace) -> int:
    command = _command(args)
    if args.tty and not args.detach:
        raise SpecError(
            "-t",
            "a terminal needs -d here (sbxkit exec -dt NAME -- sh, then write/logs); for an "
            "interactive shell use sbxkit shell",
        )
    env = env_flags(args.env) or None
    timeout = _seconds(args.timeout, "--timeout")
    source = "-" if args.interactive else args.stdin
    if args.detach:
        if source is not None and source != "none":
            raise SpecError("--stdin", "a detached process takes its input from sbxkit write")
        answer = client.ask(
            args.name,
            wire.Start(
                secret="",
                argv=command,
                pty=args.tty,
                timeout_s=timeout,
                workdir=args.workdir,
                env=env,
            ),
        )
        started = client.expect(answer, wire.Started)
        print(json.dumps({"process": started.process}) if args.json else started.process)
        return 0
    stdin = _input(source, "--stdin")
    answer = client.ask(
        args.name,
        wire.Exec(
            secret="", argv=command, stdin=stdin, timeout_s=timeout, workdir=args.workdir, env=env
        ),
    )
    ran = client.expect(answer, wire.Ran).result
    return print_result(ran, json=args.json, bounds=RunBounds(timeout_s=timeout))


def _describe(ended: ProcessExit) -> str:
    if ended.status == "exited":
        return f"exited {ended.exit_code}"
    why = ended.kill_evidence or ended.oom_evidence
    return ended.status.replace("_", " ") + (f" ({why})" if why else "")


def _print_exit(ended: ProcessExit, as_json: bool) -> int:
    if as_json:
        sys.stdout.buffer.write(msgspec.json.encode(ended) + b"\n")
    else:
        print(_describe(ended))
    return exit_code_for(ended)


def cmd_logs(args: argparse.Namespace) -> int:
    cursor = args.cursor
    out = sys.stdout.buffer
    while True:
        answer = client.ask(
            args.name,
            wire.Read(
                secret="",
                process=args.process,
                cursor=cursor,
                max_bytes=READ_BYTES,
                wait_s=FOLLOW_WAIT_S if args.follow else 0.0,
            ),
        )
        output = client.expect(answer, wire.Output)
        if args.json:
            doc = {
                "data_base64": base64.b64encode(output.data).decode(),
                "cursor": output.cursor,
                "done": output.done,
                "exit": msgspec.to_builtins(output.exit),
            }
            out.write(json.dumps(doc).encode() + b"\n")
        else:
            out.write(output.data)
        out.flush()
        cursor = output.cursor
        if output.done or (not args.follow and not output.data):
            return 0


def cmd_write(args: argparse.Namespace) -> int:
    if args.text is not None:
        data = args.text.encode()
    elif stdin_carries_data():
        data = _input("-", "stdin") or b""
    else:
        data = b""
    if not data and not args.eof:
        raise SpecError("TEXT", "nothing to write: give TEXT, pipe it in, or pass --eof")
    client.expect(
        client.ask(args.name, wire.Write(secret="", process=args.process, data=data, eof=args.eof)),
        wire.Done,
    )
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    answer = client.expect(
        client.ask(args.name, wire.Wait(secret="", process=args.process)), wire.Ended
    )
    assert answer.exit is not None  # no timeout asked: it ended
    return _print_exit(answer.exit, args.json)


def cmd_kill(args: argparse.Namespace) -> int:
    if args.signal is not None:
        client.expect(
            client.ask(args.name, wire.Signal(secret="", process=args.process, signal=args.signal)),
            wire.Done,
        )
        return 0
    answer = client.expect(
        client.ask(args.name, wire.Kill(secret="", process=args.process)), wire.Ended
    )
    assert answer.exit is not None
    _print_exit(answer.exit, args.json)
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    rows = client.expect(client.ask(args.name, wire.List(secret="")), wire.Processes).rows
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(rows) + b"\n")
        return 0
    print(f"{'PROCESS':<20} {'STATE':<24} {'OUTPUT':>10}  COMMAND")
    for row in rows:
        state = "running" if row.exit is None else _describe(row.exit)
        print(f"{row.process:<20} {state[:24]:<24} {row.output_bytes:>10}  {' '.join(row.command)}")
    return 0


def cmd_sessions(args: argparse.Namespace) -> int:
    directory = client.sessions_directory(create=False)
    names = []
    with contextlib.suppress(FileNotFoundError):
        names = sorted(n[: -len(".json")] for n in os.listdir(directory) if n.endswith(".json"))
    listed = []
    for name in names:
        if not wire.NAME_PATTERN.fullmatch(name):
            continue
        record = client.read_record(directory, name)
        if record is None:
            continue
        live = client.connect(record)
        if live is None:
            client.clear(directory, name)  # its holder is gone, and with it the sandbox
            continue
        live.close()
        listed.append(record)
    if args.json:
        rows = [{k: v for k, v in msgspec.to_builtins(r).items() if k != "secret"} for r in listed]
        print(json.dumps(rows))
        return 0
    print(f"{'NAME':<24} {'CONTAINER':<12} {'ENDS IN':>8}  {'IMAGE':<32} PORTS")
    now = time.time()
    for record in listed:
        left = max(0, int(record.expires - now))
        ports = ",".join(record.ports)
        print(
            f"{record.name:<24} {record.container_id[:12]:<12} {left:>7}s  "
            f"{record.image:<32} {ports}".rstrip()
        )
    return 0


def cmd_close(args: argparse.Namespace) -> int:
    for name in args.names:
        try:
            client.expect(client.ask(name, wire.Close(secret="")), wire.Done)
            with contextlib.suppress(FileNotFoundError):  # its log goes with it, as docker rm's
                os.unlink(wire.log_path(client.sessions_directory(create=False), name))
        except SessionError as exc:
            if "no open session" in exc.reason or "holder is gone" in exc.reason:
                say(f"sbxkit: {exc}", sys.stderr)  # nothing left to close
                continue
            raise
    return 0


def _split_target(text: str) -> tuple[str, str] | None:
    name, colon, path = text.partition(":")
    if colon and wire.NAME_PATTERN.fullmatch(name) and path:
        return name, path
    return None


def cmd_cp(args: argparse.Namespace) -> int:
    source, dest = _split_target(args.src), _split_target(args.dest)
    if (source is None) == (dest is None):
        raise SpecError(
            "cp", "exactly one side names a session: sbxkit cp LOCAL NAME:PATH or NAME:PATH LOCAL"
        )
    if dest is not None:  # in
        local = os.path.abspath(args.src)
        if os.path.isdir(local):
            client.expect(
                client.ask(dest[0], wire.PutDir(secret="", local=local, dest=dest[1])), wire.Done
            )
            return 0
        data = _input(local, "SRC")
        request = wire.PutFile(secret="", dest=dest[1], data=data or b"")
        client.expect(client.ask(dest[0], request), wire.Done)
        return 0
    assert source is not None
    local = os.path.abspath(args.dest)
    answer = client.ask(source[0], wire.GetPath(secret="", src=source[1], local=local))
    if isinstance(answer, wire.FileData):
        _write_new(local, answer.data)
    return 0


def _write_new(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise SpecError("DEST", f"{path} exists; sbxkit cp does not overwrite") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


# --- the parsers -------------------------------------------------------------------------------


def _add(
    sub: Any, name: str, handler: Callable[[argparse.Namespace], int], **kwargs: Any
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    parser.set_defaults(handler=handler)
    return parser


def _session_args(parser: argparse.ArgumentParser, *, process: bool = True) -> None:
    parser.add_argument("name", metavar="NAME", help="the session (sbxkit open's name)")
    if process:
        parser.add_argument("process", metavar="PROCESS", help="its id (sbxkit exec -d's output)")


def add_session_parsers(sub: Any) -> None:
    opener = _add(
        sub,
        "open",
        cmd_open,
        help="open a sandbox that stays for sbxkit exec, cp, logs ... until sbxkit close",
        usage=image_usage("open"),
        epilog="prints the session's name. exit status: 0 open; 2 refused input; "
        "69 engine unavailable; 75 capacity; 70 other error",
    )
    add_sandbox_flags(
        opener,
        OPEN_DEFAULTS,
        profile_help="TOML profile ([sandbox.docker]); flags override it",
        output_help="bytes kept per stream of each command (a background process's in all)",
        timeout_help="the session's time limit: then its sandbox is removed",
        network_help="none (default; --allow and --callback govern its egress), or bridge",
    )
    add_kind_flags(opener)
    opener.add_argument("--name", help=f"the session's name ({wire.NAME_RULE}; default: sb-XXXXXX)")
    opener.add_argument(
        "--max-transfer",
        metavar="SIZE",
        help="content one sbxkit cp of a directory moves at most (default: 1g)",
    )
    opener.add_argument(
        "--max-transfer-entries",
        metavar="N",
        help="files and directories one sbxkit cp moves at most (default: 100000)",
    )
    opener.add_argument(
        "--files-root",
        metavar="PATH",
        help="where sbxkit cp may read and write (default: /tmp; / with --disk)",
    )
    opener.add_argument("--json", action="store_true", help="print one JSON object")
    opener.add_argument(
        "command", nargs=argparse.REMAINDER, action=ImageAndCommand, metavar="IMAGE"
    )

    execer = _add(
        sub,
        "exec",
        cmd_exec,
        help="run a command in an open sandbox (-d: in the background)",
        usage="sbxkit exec [options] NAME -- CMD...",
        epilog="exit status: as sbxkit run's (the command's own; 124 timed out ...); "
        "with -d, 0 once started",
    )
    execer.add_argument(
        "-d", "--detach", action="store_true", help="start it in the background; print its id"
    )
    execer.add_argument("-t", "--tty", action="store_true", help="on a terminal (with -d)")
    execer.add_argument(
        "-i", "--interactive", action="store_true", help="send this stdin (--stdin -)"
    )
    execer.add_argument(
        "--stdin", metavar="FILE|-|none", help="feed a file, - (this stdin) or none"
    )
    execer.add_argument("-w", "--workdir", help="absolute working directory")
    execer.add_argument(
        "-e", "--env", action="append", default=[], metavar="K=V", help="set a variable"
    )
    execer.add_argument("--timeout", help="its time limit (default: the session's time left)")
    execer.add_argument("--json", action="store_true", help="print one JSON object")
    execer.add_argument("name", metavar="NAME")
    execer.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD")

    logs = _add(sub, "logs", cmd_logs, help="a background process's output, from a cursor")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    logs.add_argument("--cursor", type=int, default=0, help="the byte to start from (default 0)")
    logs.add_argument("--json", action="store_true", help="JSON lines: data, next cursor, exit")
    _session_args(logs)

    writer = _add(sub, "write", cmd_write, help="write to a background process's stdin")
    writer.add_argument("--eof", action="store_true", help="then close its stdin")
    _session_args(writer)
    writer.add_argument("text", nargs="?", metavar="TEXT", help="what to write (default: stdin)")

    waiter = _add(
        sub,
        "wait",
        cmd_wait,
        help="wait for a background process to end",
        epilog="prints how it ended; exits with its status as sbxkit run would",
    )
    waiter.add_argument("--json", action="store_true", help="print one JSON object")
    _session_args(waiter)

    killer = _add(sub, "kill", cmd_kill, help="kill a background process's group, or signal it")
    killer.add_argument("-s", "--signal", help="send this signal (TERM, 15 ...) instead of killing")
    killer.add_argument("--json", action="store_true", help="print one JSON object")
    _session_args(killer)

    lister = _add(sub, "ps", cmd_ps, help="an open sandbox's background processes")
    lister.add_argument("--json", action="store_true", help="print JSON")
    _session_args(lister, process=False)

    listing = _add(sub, "sessions", cmd_sessions, help="the open sandboxes of this account")
    listing.add_argument("--json", action="store_true", help="print JSON")

    closer = _add(sub, "close", cmd_close, help="remove open sandboxes")
    closer.add_argument("names", nargs="+", metavar="NAME")

    copier = _add(
        sub,
        "cp",
        cmd_cp,
        help="copy a file or directory into or out of an open sandbox",
        usage="sbxkit cp LOCAL NAME:PATH\n       sbxkit cp NAME:PATH LOCAL",
    )
    copier.add_argument("src", metavar="SRC")
    copier.add_argument("dest", metavar="DEST")
