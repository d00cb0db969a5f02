"""The holder of one open sandbox: ``sbxkit open`` starts it, detached, and it serves the
commands that name the session until ``sbxkit close``, the session's time limit, or a signal.

Started as ``python -m sbxkit.cli._session_holder`` with an ``OpenPlan`` on its stdin: the
spec ``sbxkit open`` made from its flags and checked. It opens the sandbox through the
supervisor, listens on ``NAME.sock``, writes ``NAME.json``, and reports on its stdout — one
JSON line, ``{"ok": true}`` or the error — before letting go of it. Its stderr is ``NAME.log``.

Who may ask. The socket lives in the sessions directory (0700, this account's) and every
request carries the secret from ``NAME.json`` (0600); the peer's uid (``SO_PEERCRED``) must be
this process's. A wrong secret or uid is refused and logged; nothing else is answered.

How it ends. However it ends, the sandbox is removed (``open_sandbox``'s block) before the
files go; if this process is killed outright, the supervisor removes the sandbox (its owner
is gone) and the next client finds the files stale and clears them.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import posixpath
import secrets
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import NoReturn

import msgspec
import trio

import sbxkit.cli._session_wire as wire
from sbxkit._consumers.processes import Process
from sbxkit._consumers.session import Sandbox, open_sandbox
from sbxkit._grammar.backend_choice import cli_backend
from sbxkit._grammar.common import exit_code_for_error
from sbxkit._grammar.profile import load_profile, profile_settings
from sbxkit._model.network_ports import port_text
from sbxkit._protocol.framing import FrameReader
from sbxkit._util.notice import say
from sbxkit._util.unwrap import plain_async
from sbxkit.backends.base import open_backend
from sbxkit.errors import ArchiveError, SbxError, SpecError

MAX_KEPT = 64
"""Processes remembered at once, ended ones included (``logs`` and ``wait`` after the end);
beyond it the oldest ended one is forgotten."""
CLOSE_WAIT_S = 60.0


class Held:
    def __init__(self, process: Process, argv: list[str]) -> None:
        self.process = process
        self.argv = argv


class Holder:
    def __init__(self, sandbox: Sandbox, secret: str, stop: Callable[[], None]) -> None:
        self.sandbox = sandbox
        self.secret = secret
        self.stop = stop
        self.held: dict[str, Held] = {}

    def _process(self, process_id: str) -> Process:
        entry = self.held.get(process_id)
        if entry is None:
            known = ", ".join(self.held) or "none"
            raise SpecError(
                "PROCESS", f"{process_id!r} is no process of this session (known: {known})"
            )
        return entry.process

    def _keep(self, process: Process, argv: list[str]) -> None:
        if len(self.held) >= MAX_KEPT:
            for key, entry in list(self.held.items()):
                if entry.process.exit is not None:
                    del self.held[key]
                    break
        self.held[process.id] = Held(process, argv)

    async def answer(self, request: wire.AnyRequest) -> wire.AnyAnswer:
        sandbox = self.sandbox
        if isinstance(request, wire.Exec):
            result = await sandbox.exec(
                request.argv,
                request.stdin,
                timeout=request.timeout_s,
                workdir=request.workdir,
                env=request.env,
            )
            return wire.Ran(result=result)
        if isinstance(request, wire.Start):
            process = await sandbox.start(
                request.argv,
                pty=request.pty,
                timeout=request.timeout_s,
                workdir=request.workdir,
                env=request.env,
            )
            self._keep(process, request.argv)
            return wire.Started(process=process.id)
        if isinstance(request, wire.Read):
            process = self._process(request.process)
            data, cursor, done = await process.read(
                request.cursor, max_bytes=request.max_bytes, wait=request.wait_s
            )
            return wire.Output(data=data, cursor=cursor, done=done, exit=process.exit)
        if isinstance(request, wire.Write):
            process = self._process(request.process)
            if request.data:
                await process.write(request.data)
            if request.eof:
                await process.close_stdin()
            return wire.Done()
        if isinstance(request, wire.Wait):
            process = self._process(request.process)
            with trio.move_on_after(
                float("inf") if request.timeout_s is None else request.timeout_s
            ):
                return wire.Ended(exit=await process.wait())
            return wire.Ended(exit=None)
        if isinstance(request, wire.Signal):
            await self._process(request.process).signal(_signal_of(request.signal))
            return wire.Done()
        if isinstance(request, wire.Kill):
            return wire.Ended(exit=await self._process(request.process).kill())
        if isinstance(request, wire.List):
            rows = [
                wire.ProcessRow(
                    process=key,
                    command=entry.argv,
                    pty=entry.process.pty,
                    output_bytes=entry.process.output_bytes,
                    exit=entry.process.exit,
                )
                for key, entry in self.held.items()
            ]
            return wire.Processes(rows=rows)
        if isinstance(request, wire.PutDir):
            await sandbox.put_dir(request.local, request.dest)
            return wire.Done()
        if isinstance(request, wire.PutFile):
            folder, base = posixpath.split(request.dest)
            await sandbox.put_files({base: request.data}, folder or ".")
            return wire.Done()
        if isinstance(request, wire.GetPath):
            try:
                files = await sandbox.get_files([request.src], max_bytes=wire.MAX_INPUT_BYTES)
            except ArchiveError as exc:
                # the daemon's tar of a directory starts with the directory itself
                if not exc.reason.startswith("directory members are refused"):
                    raise
                await sandbox.get_dir(request.src, request.local)
                return wire.Done()
            return wire.FileData(data=files[request.src])
        self.stop()  # Close: the block ends, the sandbox is removed, then the answer goes
        return wire.Done()


def _signal_of(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _peer_uid(sock: trio.socket.SocketType) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


async def _receive(stream: trio.SocketStream) -> bytes | None:
    reader = FrameReader(wire.MAX_FRAME)
    while True:
        chunk = await stream.receive_some(256 * 1024)
        if not chunk:
            return None
        frames = reader.feed(chunk)
        if frames:
            return frames[0]


def _failed(error: SbxError) -> wire.Failed:
    return wire.Failed(
        error=type(error).__name__,
        message=str(error),
        field=getattr(error, "field", None),
        code=exit_code_for_error(error),
    )


async def _serve_one(holder: Holder, stream: trio.SocketStream, closing: trio.Event) -> None:
    """One request, one answer; a connection that does not prove itself gets none."""
    async with stream:
        if _peer_uid(stream.socket) != os.geteuid():
            say("sbxkit holder: refused a connection from another uid", sys.stderr)
            return
        try:
            payload = await _receive(stream)
            if payload is None:
                return
            request = wire.decode_request(payload)
        except Exception as exc:  # a malformed frame: whoever sent it gets nothing
            say(f"sbxkit holder: refused a malformed request ({exc})", sys.stderr)
            return
        if not hmac.compare_digest(request.secret.encode(), holder.secret.encode()):
            say(
                f"sbxkit holder: refused a {type(request).__name__} with a wrong secret", sys.stderr
            )
            return
        try:
            answer = await holder.answer(request)
        except SbxError as exc:
            answer = _failed(exc)
        if isinstance(request, wire.Close):
            await closing.wait()  # answered once the sandbox is gone (or its removal failed)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(wire.frame(answer))


def _write_record(directory: str, record: wire.SessionRecord) -> None:
    path = wire.record_path(directory, record.name)
    temp = path + ".tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(msgspec.json.encode(record))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


@plain_async
async def hold(plan: wire.OpenPlan, report: Callable[[dict[str, object]], None]) -> int:
    """Hold the session until it is closed, expires or gets a signal; ``report`` is called
    once the sandbox is open and the session's files are written."""
    name, spec, files_root = plan.name, plan.spec, plan.files_root
    profile = load_profile(plan.profile) if plan.profile is not None else None
    settings = profile_settings(profile)[0] if profile is not None else None
    backend = cli_backend(profile, socket_path=plan.socket, settings=settings)
    directory = wire.sessions_dir()
    sock_path = wire.socket_path(directory, name)
    secret = secrets.token_urlsafe(32)
    closing = trio.Event()
    accepting = trio.CancelScope()
    listener_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)  # sbxkit open made sure no holder answers there
    await listener_sock.bind(sock_path)
    listener_sock.listen(64)
    try:
        async with trio.open_nursery() as connections:
            try:
                async with (
                    open_backend(backend),
                    open_sandbox(spec, backend=backend, files_root=files_root) as sandbox,
                ):
                    with trio.CancelScope() as held:
                        holder = Holder(sandbox, secret, held.cancel)
                        now = time.time()
                        left = max(0.0, sandbox.deadline - trio.current_time())
                        bound = await sandbox.ports()
                        ports = [port_text(port) for port in bound]
                        _write_record(
                            directory,
                            wire.SessionRecord(
                                name=name,
                                socket=sock_path,
                                secret=secret,
                                pid=os.getpid(),
                                container_id=sandbox.container_id,
                                image=sandbox.spec.image,
                                started=now,
                                expires=now + left,
                                ports=ports,
                            ),
                        )
                        connections.start_soon(_accept, listener_sock, holder, closing, accepting)
                        given = [msgspec.to_builtins(port) for port in bound]
                        report({"ok": True, "container_id": sandbox.container_id, "ports": given})
                        say(f"sbxkit holder: {name} holds {sandbox.container_id[:12]}", sys.stderr)
                        await _until_signal()
                say(f"sbxkit holder: {name} closed; its sandbox is removed", sys.stderr)
            finally:
                closing.set()
                accepting.cancel()
                _remove_files(directory, name, sock_path)
                # the answers in flight (a close's among them) go out, then the rest is cut
                connections.cancel_scope.deadline = trio.current_time() + 5.0
    finally:
        listener_sock.close()
        _remove_files(directory, name, sock_path)
    return 0


def _remove_files(directory: str, name: str, sock_path: str) -> None:
    for path in (wire.record_path(directory, name), sock_path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


async def _accept(
    listener_sock: trio.socket.SocketType,
    holder: Holder,
    closing: trio.Event,
    accepting: trio.CancelScope,
) -> None:
    async with trio.open_nursery() as requests:
        with accepting:
            while True:
                sock, _ = await listener_sock.accept()
                requests.start_soon(_serve_one, holder, trio.SocketStream(sock), closing)


async def _until_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            say(f"sbxkit holder: {signal.Signals(signum).name}: closing", sys.stderr)
            return


def main() -> NoReturn:
    """``python -m sbxkit.cli._session_holder`` with an ``OpenPlan`` on stdin (``sbxkit open``
    runs it)."""
    reported = False

    def report(doc: dict[str, object]) -> None:
        nonlocal reported
        reported = True
        with contextlib.suppress(OSError):
            os.write(1, json.dumps(doc).encode() + b"\n")
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # let go of the pipe: sbxkit open returns
            os.close(devnull)

    code = 0
    try:
        plan = msgspec.json.decode(sys.stdin.buffer.read(), type=wire.OpenPlan)
        code = trio.run(hold, plan, report)
    except SbxError as exc:
        say(f"sbxkit holder: {exc}", sys.stderr)
        code = exit_code_for_error(exc)
        if not reported:
            failed = _failed(exc)
            report({"ok": False, **msgspec.to_builtins(failed)})
    except BaseException as exc:  # anything else: said, and the opener told
        say(f"sbxkit holder: failed: {exc!r}", sys.stderr)
        code = 70
        if not reported:
            report(
                {
                    "ok": False,
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "field": None,
                    "code": code,
                }
            )
        if not isinstance(exc, Exception):
            raise
    sys.exit(code)


if __name__ == "__main__":
    main()
