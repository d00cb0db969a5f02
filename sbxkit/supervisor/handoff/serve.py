"""The supervisor's side of ``sbxkit run``'s hand-off (docs/operations.md).

``serve_run`` answers a ``Run``: the argv is parsed by the CLI's own ``run`` parser (one grammar; a
parser that would print or exit declines instead), the spec built by the CLI's own
``spec_from_args`` under the caller's environment (``sbxkit/_util/environment.py``), and the run is
the Docker backend's — ``PooledBackend`` for ``--pool`` — with two differences only:

- its owner is this supervisor in-process (``owner.ServedOwner``): the same admission,
  re-check of the create body, journal and lease task as any lease;
- once the sandbox waits for its go (or claim) line, ``HandOff.supervise`` takes the place of
  ``supervise_kernel``: the FIFO ends and the init's pidfd go to the command line
  (``RunStarted``, ``SCM_RIGHTS``) and this process closes its copies of the ends; it keeps
  its own pidfd of the init and the sandbox's OOM watch, and judges the exit the command line
  reports (``RunEnded``) with ``kernel_verdict`` as ever.

Output and stdin never pass through here. What the hand-off does not serve — an option it does
not take, the daemon's path, a refusal before anything could have run — is declined
(``RunDeclined``) and the command line runs the full path, which reproduces the error exactly.
Once the command line waited for capacity, or holds the sandbox's ends, an error is reported
as ``sbxkit run`` reports it (``RunError``).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import trio

from sbxkit._grammar.backend_choice import held_pool
from sbxkit._grammar.common import (
    Parser,
    exit_code_for,
    exit_code_for_error,
    json_error,
)
from sbxkit._grammar.flags import parse_with_flags_after_image, spec_from_args
from sbxkit._grammar.result_doc import result_doc
from sbxkit._grammar.run_grammar import (
    RunBounds,
    add_run_parser,
    bounds_of,
    run_pool,
    status_notice,
)
from sbxkit._kernel.init import REAP_LIMIT_S
from sbxkit._lifecycle.attached import DRAIN_GRACE_S, Outcome
from sbxkit._lifecycle.kernel_watch import AfterGo, Exited, Feed, KernelIO
from sbxkit._lifecycle.output import OutputCapture
from sbxkit._model.gpu import GpuCursor
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._protocol.wire import (
    Queued,
    Run,
    RunCancel,
    RunDeclined,
    RunEnded,
    RunError,
    RunInterrupted,
    RunReport,
    RunStarted,
    WireError,
)
from sbxkit._util.environment import caller_environ, judged_under
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.engine.discovery import candidate_sockets
from sbxkit.errors import CleanupError, SbxError
from sbxkit.pool.held import PooledBackend
from sbxkit.supervisor.handoff.owner import Declined, ServedOwner
from sbxkit.supervisor.lease import Peer, log
from sbxkit.supervisor.pooling import Pooling
from sbxkit.supervisor.recheck import engine_socket_problem

__all__ = ["HandOff", "Reported", "parse_run", "result_document", "run_parser", "serve_run"]

LOST = (
    "the connection to the supervisor was lost before cleanup was acknowledged; durable "
    "recovery is required (the supervisor's restart recovery removes it)"
)
"""What the command line says if this supervisor is gone before its verdict (as
``SupervisedOwner`` says it)."""


async def serve_run(service: Pooling, peer: Peer, run: Run) -> None:
    """Answer one ``Run`` on its connection (see the module's docstring)."""
    await HandOff(service, peer, run).serve()


# -- the parse --------------------------------------------------------------------------------


class _QuietParser(Parser):
    """The CLI's parser, but one that would print or exit declines the hand-off instead: the
    full path prints that usage error (or help) itself."""

    def error(self, message: str) -> NoReturn:
        raise Declined(f"usage: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise Declined("the parser would exit")

    def _print_message(self, message: str, file: Any = None) -> None:
        raise Declined("the parser would print")


_PARSER: list[argparse.ArgumentParser] = []


def run_parser() -> argparse.ArgumentParser:
    """``sbxkit``'s parser with its one ``run`` subcommand (``add_run_parser``), built once."""
    if not _PARSER:
        root = _QuietParser(prog="sbxkit")
        sub = root.add_subparsers(dest="action", required=True)
        add_run_parser(sub)
        _PARSER.append(root)
    return _PARSER[0]


def parse_run(run: Run) -> argparse.Namespace:
    """The ``run`` command's arguments, as ``sbxkit run`` parses them, or ``Declined``."""
    args, unknown = parse_with_flags_after_image(run_parser(), run.argv)
    if unknown:
        raise Declined(f"unrecognized arguments: {' '.join(unknown)}")
    if args.profile is not None:
        raise Declined("--profile (it may name another supervisor or runtime)")
    if args.tty:
        raise Declined("-t is refused (the full path says why)")
    if args.interactive and args.stdin is None:
        args.stdin = "-"  # docker's -i, as take_docker_stdin reads it
    if bool(args.json) != run.json or args.stdin != run.stdin:
        raise Declined("the command line's scan of --json or --stdin disagrees with the parse")
    if args.output_encoding != "utf-8":  # the command line never hands it off (scan.py)
        raise Declined("--output-encoding is the full path's")
    for flag in ("tls_ca", "tls_cert", "tls_key"):
        value = getattr(args, flag, None)
        if value is not None and not Path(value).is_absolute():
            raise Declined(f"--{flag.replace('_', '-')} names a file relative to the caller")
    return args


# -- the backends -----------------------------------------------------------------------------


def _decline_the_daemons_path() -> None:
    raise Declined("the run takes the daemon's path")


# -- one hand-off -----------------------------------------------------------------------------


class HandOff:
    """One handed-off run on its connection: the run (``_run``), and the connection read
    beside it (``_read``: the exit the command line saw, its interrupt, its EOF)."""

    def __init__(self, service: Pooling, peer: Peer, run: Run) -> None:
        self.service = service
        self.peer = peer
        self.run = run
        self.owner: ServedOwner | None = None
        self.scope = trio.CancelScope()
        self.queued = False
        self.handed_over = False
        self.ended = trio.Event()
        self.report: RunEnded | None = None
        self.signal: int | None = None
        self.bounds = RunBounds()
        """The run's limits, once parsed: its verdict line names them."""

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read)
            try:
                answer = await self._answer()
            finally:
                nursery.cancel_scope.cancel()
        if answer is not None:
            await self.peer.send(answer)

    async def _answer(self) -> RunDeclined | RunError | RunReport | RunInterrupted | None:
        try:
            with judged_under(self.run.env):
                result = await self._run_it()
        except Declined as exc:
            return self._declined(str(exc))
        except SbxError as exc:
            if self.signal is not None and not isinstance(exc, CleanupError):
                return RunInterrupted()
            if self.handed_over or self.queued or isinstance(exc, CleanupError):
                return self._error(exc)
            return self._declined(f"{type(exc).__name__}: {exc}")
        if result is None:  # cancelled: the command line was interrupted, or is gone
            return RunInterrupted() if self.signal is not None else None
        return self._report(result)

    async def _run_it(self) -> RunResult | None:
        run = self.run
        if Path(run.state_dir) != self.service.state.path:
            raise Declined("the caller's state directory names another supervisor")
        if self.service.config.docker_socket is not None:
            raise Declined("this supervisor relays to a pinned daemon socket")
        args = parse_run(run)
        spec = spec_from_args(args, None)
        self.bounds = bounds_of(spec)
        pool = run_pool(args, None)
        with self.scope:
            engine = await self._engine(args.socket)
            self.owner = ServedOwner(self.service, engine, self._queued)
            options: dict[str, Any] = {
                "engine": engine,
                "owner": self.owner,
                "settings": Settings(supervisor_state_dir=str(self.service.state.path)),
                "gpu_cursor": GpuCursor(),  # a fresh one, as a process of its own would have
                "recover_at_open": False,
            }
            backend: DockerBackend
            if pool is not None:  # claimed from this supervisor's pool, else cold
                backend = PooledBackend(pool=held_pool(pool), **options)
            else:
                backend = DockerBackend(**options)
            # The kernel's path or none: the command line cannot read a daemon's attach stream.
            backend.on_daemon_path = _decline_the_daemons_path
            backend.kernel_supervise = self.supervise
            checked = backend.check(spec, "run")
            return await backend.run_once(checked, None)
        return None

    async def _engine(self, socket: str | None) -> Engine:
        """The daemon the command line would have used: ``--socket``, else the first of its
        environment's candidates (``DOCKER_HOST``, the standard places) that answers here —
        never one this supervisor was not started for."""
        try:
            candidates: Sequence[str] = (
                [socket] if socket else candidate_sockets(dict(caller_environ()))
            )
        except SbxError as exc:
            raise Declined(f"the daemon's socket: {exc}") from None
        for path in candidates:
            problem = engine_socket_problem(path, None, self.service.allowed_sockets)
            if problem is not None:
                raise Declined(problem)
            try:
                return await self.service.engine_for(path)
            except SbxError:
                continue
        raise Declined("no daemon answered here; the full path says why")

    async def _queued(self, queued: Queued) -> None:
        """The run waits for capacity: the command line hears it (a terminal's notice), and
        from now on an error is reported, not declined (the full path would wait again)."""
        self.queued = True
        await self.peer.send(queued)

    async def supervise(
        self, io: KernelIO, exited: Exited, feed: Feed, after_go: AfterGo
    ) -> Outcome:
        """``supervise_kernel``'s place: hand the ends to the command line (which writes the
        go line; ``after_go`` runs once they are handed over), watch the init's exit here (the
        OOM watch reads its count then), take the outcome it reports."""
        init = io.init
        if init is None:
            raise Declined("the sandbox's init could not be held as a pidfd: the daemon's path")
        assert self.owner is not None
        lease, container_id = self.owner.current
        lost = CleanupError(lease, container_id or None, LOST)
        started = RunStarted(
            lease=lease,
            line=feed.line,
            output_bytes=feed.max_output,
            timeout_s=feed.timeout_s,
            drain_s=DRAIN_GRACE_S,
            fds=4,
            lost_status=exit_code_for_error(lost),
            lost_stderr=f"sbxkit: error: {lost}\n",
            lost_json=self._json_error(lost),
            secret=self.owner.secret,  # the connection's only: never logged, never journaled
            engine_socket=self.owner.engine_socket,
            pooled=self.owner.pooled,
            queued_s=self.owner.queued_s(lease),
            disk_bytes=self.bounds.disk_bytes,
        )
        ends = [io.stdin.fileno(), io.stdout.fileno(), io.stderr.fileno(), init.pidfd]
        self.handed_over = True  # before the send: its RunEnded may come before it returns
        if not await self.peer.send_with_fds(started, ends):
            await trio.sleep_forever()  # gone: the reader cancels the run, its sandbox removed
        for stream in (io.stdin, io.stdout, io.stderr):
            await stream.aclose()  # the command line's now: its stdin's EOF is its own close
        if after_go is not None:
            await after_go()
        code: list[int] = []
        async with trio.open_nursery() as nursery:

            async def own_exit() -> None:
                with contextlib.suppress(trio.TooSlowError):  # never reaped: said below
                    code.append(await exited())

            nursery.start_soon(own_exit)
            await self.ended.wait()
            report = self.report
            assert report is not None
            if report.status != "exited":
                nursery.cancel_scope.cancel()  # sbxkit ends it: the removal's kill
            else:
                nursery.cancel_scope.deadline = trio.current_time() + REAP_LIMIT_S + DRAIN_GRACE_S
        outcome = Outcome(Reported(report))
        outcome.status = report.status
        if report.status == "exited":
            if not code:
                raise SbxError("the command line saw the payload exit; its init runs on")
            outcome.exit_code = code[0]
        return outcome

    async def _read(self) -> None:
        """The command line's messages beside the run: ``RunEnded`` (once it holds the ends),
        ``RunCancel``; its EOF ends the run (the sandbox removed) like any caller's."""
        while True:
            try:
                message = await self.peer.receive()
            except WireError as exc:
                log(f"a handed-off run: {exc}; treated as the caller leaving")
                message = None
            if message is None:
                self._stop("caller disconnected")
                return
            if isinstance(message, RunEnded) and self.handed_over and not self.ended.is_set():
                self.report = message
                self.ended.set()
            elif isinstance(message, RunCancel):
                self.signal = message.signal
                self._stop("caller interrupted")
            else:
                log(f"a handed-off run: unexpected {type(message).__name__}; ending it")
                self._stop("protocol error")
                return

    def _stop(self, reason: str) -> None:
        self.scope.cancel()
        if self.owner is not None:
            self.owner.stop_all(reason)

    # -- answers ------------------------------------------------------------------------------

    def _declined(self, reason: str) -> RunDeclined | RunError:
        if self.handed_over:  # cannot happen: the ends were the command line's already
            return self._error(SbxError(f"declined after the hand-off: {reason}"))
        return RunDeclined(reason=reason)

    def _error(self, exc: SbxError) -> RunError:
        return RunError(
            exit_status=exit_code_for_error(exc),
            stderr=f"sbxkit: error: {exc}\n",
            json=self._json_error(exc),
        )

    def _json_error(self, exc: SbxError) -> str | None:
        if not self.run.json:
            return None
        code = exit_code_for_error(exc)
        return json_error(type(exc).__name__, str(exc), getattr(exc, "field", None), code)

    def _report(self, result: RunResult) -> RunReport:
        report = self.report
        assert report is not None  # a result comes only from a run the command line watched
        document = None
        if self.run.json:
            document = result_document(result, report.stdout_bytes, report.stderr_bytes)
        return RunReport(
            exit_status=exit_code_for(result),
            json=document,
            notice=status_notice(result, self.bounds),
        )


def result_document(result: RunResult, stdout_bytes: int, stderr_bytes: int) -> str:
    """``sbxkit run --json``'s document of a handed-off run (``_grammar.common.to_json``): its
    ``stdout`` and ``stderr`` empty — the command line, which alone has the output, puts it
    there (``client.with_output``) — and the byte counts the command line reported."""
    doc = result_doc(result)
    doc.stdout_bytes, doc.stderr_bytes = stdout_bytes, stderr_bytes
    return msgspec.json.encode(doc).decode()


class Reported(OutputCapture):
    """The output the command line kept, as far as the verdict and the result need it: none of
    its bytes (they never come here), which stream overflowed."""

    def __init__(self, report: RunEnded) -> None:
        super().__init__(0)
        self._stream = report.overflowed

    @property
    def overflowed(self) -> Any:
        return self._stream
