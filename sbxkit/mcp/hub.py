"""The sandboxes one MCP server holds for its clients (trio).

Every sandbox is an ordinary sbxkit sandbox — hardened, admitted, and owned by the supervisor
(the default owner), which removes it if this process dies, even by SIGKILL. On top of that
the hub ends each open sandbox when

- its client closes it (``sandbox_close``), or disconnects (``close_client``);
- its lifetime passes (``open_sandbox``'s own deadline, from the request's ``lifetime``);
- no call used it for ``mcp.idle_timeout`` seconds (the reaper below);
- the server stops (``close``: every sandbox is removed before it returns).

``sbxkit._consumers.session.open_sandbox`` is an ``async with`` block, and a trio cancel scope must
be left by the task that entered it, so each open sandbox lives in a holder task of the hub's
nursery until its scope is cancelled (as the Inspect provider's ``_Holder`` does): being cancelled,
``open_sandbox`` removes the container (shielded, time-bounded) — also while it is still being
created or waits for admission. A ``run`` needs no holder: it is one ``sbxkit.run`` inside the tool
call, cancelled with it.

The ``python`` tool's interpreter is one more holder per caller (``open_interpreter`` instead of
``open_sandbox``), ended the same ways, never among the caller's own sandboxes. Quotas
(``sbxkit.mcp.quotas``) count open sandboxes, interpreters and runs under way alike. Nothing here
knows MCP: the server calls the method named as each tool with the ``Caller`` and the tool's
decoded arguments. A caller's ``account`` is whose quota a call counts against (the stdio peer,
an HTTP client's credential); its ``owner`` is whose sandboxes it may see and use (the account
itself, or one HTTP session of it).
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from sbxkit._consumers.interpreter import Interpreter, OutputCallback, open_interpreter
from sbxkit._consumers.oneshot import run as sbxkit_run
from sbxkit._consumers.session import Sandbox, SandboxExpired, open_sandbox
from sbxkit._model.result import RunResult
from sbxkit.errors import (
    HubStopping,
    InterpreterDied,
    QuotaExhausted,
    SbxError,
    SpecError,
    UnknownSandbox,
)
from sbxkit.mcp.arguments import (
    FILES_ROOT,
    CloseArgs,
    ExecArgs,
    ListArgs,
    OpenArgs,
    ProcessArgs,
    ProcessKillArgs,
    ProcessListArgs,
    ProcessReadArgs,
    ProcessSignalArgs,
    ProcessStartArgs,
    ProcessWriteArgs,
    PythonArgs,
    ReadFileArgs,
    RunArgs,
    WriteFileArgs,
    base64_text,
    content_bytes,
    file_path,
)
from sbxkit.mcp.policy import McpPolicy, OpenRequest, exec_request, open_request, run_request
from sbxkit.mcp.process_calls import (
    ENDED_PROCESSES_KEPT,
    HeldProcess,
    forget_ended,
    read_fields,
    read_request,
    signal_number,
    start_request,
)
from sbxkit.mcp.python_calls import PythonAnswer, python_request, restart_hint
from sbxkit.mcp.quotas import Quotas
from sbxkit.mcp.shapes import SandboxView, sandbox_list

logger = logging.getLogger("sbxkit.mcp")

ENDED_MEMORY = 1024
"""How many ended sandboxes the hub remembers, to say why an id no longer works."""
LIFETIME_MARGIN_S = 1.0
"""A command stops this long before its sandbox's lifetime ends, so that it ends as a
timeout of its own instead of under the sandbox's removal."""
MAX_REAP_INTERVAL_S = 1.0
CLOSE_BUDGET_S = 60.0
"""The longest the hub waits for a sandbox's removal; sbxkit's own removal is time-bounded,
and past this the supervisor, which holds every lease, removes what is left."""


@dataclass(frozen=True)
class Caller:
    """Who makes a call (see the module doc): both parts come from the transport — the stdio
    peer, or an authenticated credential and the session the server issued it — never from
    anything a request merely says."""

    account: str
    owner: str


def new_sandbox_id() -> str:
    return "sbx-" + secrets.token_hex(12)


@dataclass
class OpenSandbox:
    """One open sandbox and its holder task's state."""

    sandbox_id: str
    client: Caller
    request: OpenRequest
    opened: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """The holder's: cancelling it ends the sandbox, opened or still opening."""
    closed: trio.Event = field(default_factory=trio.Event)
    sandbox: Sandbox | None = None
    error: Exception | None = None
    ended: str | None = None
    last_used: float = 0.0
    busy: int = 0
    processes: dict[str, HeldProcess] = field(default_factory=dict)
    python: bool = False
    """A session's ``python`` interpreter: its sandbox is not among the client's own."""
    interpreter: Interpreter | None = None

    def end(self, why: str) -> None:
        if self.ended is None:
            self.ended = why
        self.scope.cancel()

    @property
    def usable(self) -> bool:
        return self.sandbox is not None and not self.scope.cancel_called


class Hub:
    """See the module doc. ``serve`` runs the holders; ``close`` removes everything."""

    def __init__(self, policy: McpPolicy, *, socket_path: str | None = None) -> None:
        self.policy = policy
        self.socket_path = socket_path
        options = policy.options
        self.quotas = Quotas(options.max_sandboxes_per_client, options.max_sandboxes)
        self._python_request = open_request(policy, OpenArgs())
        """The ``python`` tool's sandbox: the profile's image, limits and lifetime."""
        self.started = trio.Event()
        self._open: dict[str, OpenSandbox] = {}
        self._python: dict[Caller, OpenSandbox] = {}
        self._ended: OrderedDict[str, tuple[Caller, str]] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._closing = trio.Event()
        self._stopped = trio.Event()

    # -- lifetime of the hub ------------------------------------------------------------------

    async def serve(self) -> None:
        """Hold open sandboxes until ``close``; then remove every one before returning."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reap_idle)
                self.started.set()
                try:
                    await self._closing.wait()
                finally:
                    with trio.CancelScope(shield=True):
                        await self._end_all(lambda entry: True, "the server stopped")
                    nursery.cancel_scope.cancel()
        finally:
            self._stopped.set()

    async def close(self) -> None:
        """Remove every open sandbox and stop ``serve`` (waits for both, shielded)."""
        self._closing.set()
        with trio.CancelScope(shield=True):
            await self._stopped.wait()

    async def close_client(self, client: Caller) -> None:
        """The client disconnected: remove its sandboxes (waits, shielded)."""
        with trio.CancelScope(shield=True):
            await self._end_all(lambda entry: entry.client == client, "its client disconnected")

    async def _end_all(self, which: Any, why: str) -> None:
        chosen = [entry for entry in self._open.values() if which(entry)]
        for entry in chosen:
            entry.end(why)
        with trio.move_on_after(CLOSE_BUDGET_S) as budget:
            for entry in chosen:
                await entry.closed.wait()
        if budget.cancelled_caught:
            left = [entry.sandbox_id for entry in chosen if not entry.closed.is_set()]
            logger.error(
                "sandboxes %s not confirmed removed within %g s; the supervisor holds their "
                "leases and removes them when this process ends",
                ", ".join(left),
                CLOSE_BUDGET_S,
            )

    async def _wait_removed(self, entry: OpenSandbox) -> None:
        """Wait (shielded, time-bounded) for an ended sandbox's removal; raise its failure."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_BUDGET_S):
            await entry.closed.wait()
        if not entry.closed.is_set():
            raise SbxError(
                f"{entry.sandbox_id}: removal not confirmed within {CLOSE_BUDGET_S:g} s; the "
                "supervisor holds its lease and removes it"
            )
        if entry.error is not None:
            raise entry.error

    async def _reap_idle(self) -> None:
        idle_timeout = self.policy.options.idle_timeout
        while True:
            await trio.sleep(min(MAX_REAP_INTERVAL_S, idle_timeout / 4))
            now = trio.current_time()
            for entry in list(self._open.values()):
                idle = entry.sandbox is not None and not entry.busy
                if idle and now - entry.last_used >= idle_timeout:
                    entry.end(f"no call used it for {idle_timeout:g} s (mcp.idle_timeout)")

    # -- one open sandbox ---------------------------------------------------------------------

    async def _hold(self, entry: OpenSandbox) -> None:
        """Open the sandbox and keep it until ended; never raises (a holder that did would end
        every other sandbox of the hub)."""
        opening = open_interpreter if entry.python else open_sandbox
        try:
            with entry.scope:
                async with opening(
                    entry.request.spec,
                    settings=self.policy.settings,
                    socket_path=self.socket_path,
                    max_processes=self.policy.options.max_processes,
                ) as opened:
                    if isinstance(opened, Interpreter):
                        entry.interpreter = opened
                    entry.sandbox = opened if isinstance(opened, Sandbox) else opened.sandbox
                    entry.last_used = trio.current_time()
                    entry.opened.set()
                    await trio.sleep_forever()
        except SandboxExpired:
            entry.end(f"its lifetime of {entry.request.lifetime_s:g} s passed")
        except Exception as exc:
            entry.error = exc
            entry.end(f"it failed: {exc}")
            if entry.sandbox is not None:  # opened, then failed: nobody waits to hear it
                logger.warning("sandbox %s: %s", entry.sandbox_id, exc)
        finally:
            self._open.pop(entry.sandbox_id, None)
            if self._python.get(entry.client) is entry:
                del self._python[entry.client]
            self._remember(entry)
            self.quotas.give(entry.client.account)
            entry.opened.set()
            entry.closed.set()

    def _remember(self, entry: OpenSandbox) -> None:
        self._ended[entry.sandbox_id] = (entry.client, entry.ended or "it was closed")
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _find(self, client: Caller, sandbox_id: str) -> OpenSandbox:
        entry = self._open.get(sandbox_id)
        if entry is not None and entry.client == client and entry.usable and not entry.python:
            return entry
        ended = self._ended.get(sandbox_id)
        if ended is not None and ended[0] == client:
            raise UnknownSandbox(f"{sandbox_id} has ended: {ended[1]}")
        raise UnknownSandbox(
            f"no open sandbox {sandbox_id} for this client (sandbox_list shows yours)"
        )

    @contextmanager
    def _using(self, client: Caller, sandbox_id: str) -> Iterator[Sandbox]:
        """The client's open sandbox, marked busy (not idle) while a call uses it."""
        entry = self._find(client, sandbox_id)
        assert entry.sandbox is not None
        with _busy(entry):
            yield entry.sandbox

    async def view(self, entry: OpenSandbox) -> SandboxView:
        """What the tools say of an open sandbox, its forwarded ports asked of its owner now
        (a re-adopting supervisor binds them anew)."""
        assert entry.sandbox is not None
        ports = await entry.sandbox.ports()
        now = trio.current_time()
        return SandboxView(
            sandbox_id=entry.sandbox_id,
            image=entry.request.spec.image,
            workdir=entry.request.spec.workdir or FILES_ROOT,
            files_root=FILES_ROOT,
            limits=entry.request.command_limits,
            lifetime_s=entry.request.lifetime_s,
            expires_in_s=max(0.0, entry.sandbox.deadline - now),
            idle_timeout_s=self.policy.options.idle_timeout,
            idle_s=0.0 if entry.busy else now - entry.last_used,
            busy=entry.busy > 0,
            ports=ports,
        )

    # -- the tools ----------------------------------------------------------------------------

    async def run(
        self, client: Caller, args: RunArgs, on_output: OutputCallback | None = None
    ) -> RunResult:
        """``on_output`` gets the output as it arrives (not for a run with ``files``, which
        is an exec in a short session: it gets the result only)."""
        request = run_request(self.policy, args)
        self._refuse_when_stopping()
        self.quotas.take(client.account)
        try:
            return await sbxkit_run(
                request.spec,
                request.stdin,
                files=request.files,
                on_output=None if request.files is not None else on_output,
                settings=self.policy.settings,
                socket_path=self.socket_path,
            )
        finally:
            self.quotas.give(client.account)

    async def sandbox_open(self, client: Caller, args: OpenArgs) -> SandboxView:
        request = open_request(self.policy, args)
        self._refuse_when_stopping()
        assert self._nursery is not None, "the hub is not serving"
        self.quotas.take(client.account)
        entry = OpenSandbox(sandbox_id=new_sandbox_id(), client=client, request=request)
        self._start_holder(entry)
        await self._opened(entry)
        return await self.view(entry)

    def _start_holder(self, entry: OpenSandbox) -> None:
        assert self._nursery is not None, "the hub is not serving"
        self._open[entry.sandbox_id] = entry
        try:
            self._nursery.start_soon(self._hold, entry)
        except BaseException:
            self._open.pop(entry.sandbox_id)
            self.quotas.give(entry.client.account)
            raise

    async def _opened(self, entry: OpenSandbox) -> None:
        """Wait for the holder to open the sandbox; raise what ended it instead."""
        try:
            await entry.opened.wait()
        except BaseException:  # cancelled while opening: remove it before the call ends
            entry.end("the call that opened it was cancelled")
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_BUDGET_S):
                await entry.closed.wait()
            raise
        if entry.sandbox is None:
            await self._wait_removed(entry)  # raises what ended it
            raise HubStopping(f"the sandbox ended while opening: {entry.ended}")

    async def sandbox_exec(
        self, client: Caller, args: ExecArgs, on_output: OutputCallback | None = None
    ) -> RunResult:
        entry = self._find(client, args.sandbox_id)
        request = exec_request(self.policy, entry.request.command_limits, args)
        with self._using(client, args.sandbox_id) as sandbox:
            left = sandbox.deadline - trio.current_time() - LIFETIME_MARGIN_S
            if left <= 0:
                raise UnknownSandbox(f"{args.sandbox_id} ends in under {LIFETIME_MARGIN_S:g} s")
            return await sandbox.exec(
                request.command,
                request.stdin,
                timeout=min(request.timeout_s, left),
                max_output=request.max_output,
                workdir=request.cwd,
                env=request.env,
                on_output=on_output,
            )

    async def sandbox_write_file(self, client: Caller, args: WriteFileArgs) -> dict[str, Any]:
        relative = file_path(args.path)
        data = content_bytes(args.content, args.encoding, self.policy.file_bytes)
        directory, _, name = relative.rpartition("/")
        with self._using(client, args.sandbox_id) as sandbox:
            await sandbox.put_files(
                {name: data}, directory or ".", max_bytes=self.policy.file_bytes, max_files=1
            )
        path = f"{FILES_ROOT}/{relative}"
        return {"sandbox_id": args.sandbox_id, "path": path, "bytes": len(data)}

    async def sandbox_read_file(self, client: Caller, args: ReadFileArgs) -> dict[str, Any]:
        relative = file_path(args.path)
        with self._using(client, args.sandbox_id) as sandbox:
            found = await sandbox.get_files(
                [relative], max_bytes=self.policy.file_bytes, max_files=1
            )
        data = found[relative]
        if args.encoding == "base64":
            content = base64_text(data)
        else:
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError:
                raise SpecError(
                    "encoding", "the file is not UTF-8 text: read it with encoding base64"
                ) from None
        return {
            "sandbox_id": args.sandbox_id,
            "path": f"{FILES_ROOT}/{relative}",
            "content": content,
            "encoding": args.encoding,
            "bytes": len(data),
        }

    async def sandbox_close(self, client: Caller, args: CloseArgs) -> dict[str, Any]:
        """Remove the sandbox before returning; a removal failure is raised, never hidden."""
        entry = self._find(client, args.sandbox_id)
        entry.end("closed by sandbox_close")
        await self._wait_removed(entry)
        return {"sandbox_id": args.sandbox_id, "closed": True}

    async def sandbox_list(self, client: Caller, args: ListArgs) -> dict[str, Any]:
        mine = [
            await self.view(entry)
            for entry in list(self._open.values())
            if entry.client == client and entry.usable and not entry.python
        ]
        quotas = self.quotas
        return sandbox_list(
            mine,
            per_client=quotas.per_client,
            held=quotas.held(client.account),
            held_in_all=quotas.held(),
            in_all=quotas.in_all,
        )

    # -- background processes (sbxkit.mcp.process_calls) ------------------------------------

    async def process_start(self, client: Caller, args: ProcessStartArgs) -> dict[str, Any]:
        entry = self._find(client, args.sandbox_id)
        request = start_request(
            self.policy, entry.request.command_limits, entry.request.lifetime_s, args
        )
        with self._using(client, args.sandbox_id) as sandbox:
            left = sandbox.deadline - trio.current_time() - LIFETIME_MARGIN_S
            if left <= 0:
                raise UnknownSandbox(f"{args.sandbox_id} ends in under {LIFETIME_MARGIN_S:g} s")
            most = self.policy.options.max_processes
            if len(sandbox.processes) >= most:  # before the session's own, naming the option
                raise QuotaExhausted(
                    "mcp.max_processes",
                    f"this sandbox already runs {len(sandbox.processes)} background processes "
                    f"(the operator allows {most}); end one with process_kill first",
                )
            process = await sandbox.start(
                request.command,
                pty=request.pty,
                env=request.env,
                workdir=request.cwd,
                max_output=request.max_output,
                timeout=min(request.timeout_s, left),
            )
        held = entry.processes[process.id] = HeldProcess(process, request.command)
        forget_ended(entry.processes)
        return held.fields(args.sandbox_id)

    async def process_write(self, client: Caller, args: ProcessWriteArgs) -> dict[str, Any]:
        data = content_bytes(args.data, args.encoding, self.policy.file_bytes, "data")
        if not data and not args.close_stdin:
            raise SpecError("data", "is empty and close_stdin is false: nothing to do")
        held = self._process(client, args)
        with self._using(client, args.sandbox_id):
            if data:
                await held.process.write(data)
            if args.close_stdin:
                await held.process.close_stdin()
                held.stdin_closed = True
        return {
            "sandbox_id": args.sandbox_id,
            "process_id": args.process_id,
            "bytes": len(data),
            "stdin_closed": held.stdin_closed,
        }

    async def process_read(self, client: Caller, args: ProcessReadArgs) -> dict[str, Any]:
        request = read_request(self.policy, args)
        held = self._process(client, args)
        with self._using(client, args.sandbox_id):
            data, _, done = await held.process.read(
                request.cursor, max_bytes=request.max_bytes, wait=request.wait_s
            )
        return read_fields(
            args.sandbox_id,
            args.process_id,
            request,
            data,
            args.encoding,
            done=done,
            exit_=held.process.exit,
        )

    async def process_signal(self, client: Caller, args: ProcessSignalArgs) -> dict[str, Any]:
        number = signal_number(args)
        held = self._process(client, args)
        with self._using(client, args.sandbox_id):
            await held.process.signal(number)
        return held.fields(args.sandbox_id)

    async def process_kill(self, client: Caller, args: ProcessKillArgs) -> dict[str, Any]:
        held = self._process(client, args)
        with self._using(client, args.sandbox_id):
            await held.process.kill()
        return held.fields(args.sandbox_id)

    async def process_list(self, client: Caller, args: ProcessListArgs) -> dict[str, Any]:
        entry = self._find(client, args.sandbox_id)
        listed = [held.fields(args.sandbox_id) for held in entry.processes.values()]
        return {
            "sandbox_id": args.sandbox_id,
            "processes": listed,
            "running": sum(1 for held in entry.processes.values() if held.process.exit is None),
            "max_processes": self.policy.options.max_processes,
        }

    def _process(self, client: Caller, args: ProcessArgs) -> HeldProcess:
        entry = self._find(client, args.sandbox_id)
        held = entry.processes.get(args.process_id)
        if held is None:
            raise SpecError(
                "process_id",
                f"no process {args.process_id} in {args.sandbox_id} (process_list shows them; "
                f"at most {ENDED_PROCESSES_KEPT} ended ones stay readable)",
            )
        return held

    # -- the python tool (sbxkit.mcp.python_calls) -------------------------------------------

    async def python(
        self, client: Caller, args: PythonArgs, on_output: OutputCallback | None = None
    ) -> PythonAnswer:
        """Run code in the caller's interpreter, opening it on its first call (or after
        ``restart``, which removes the old one first)."""
        request = python_request(self.policy, self._python_request.command_limits, args)
        entry = self._python.get(client)
        if entry is not None and request.restart:
            entry.end("restarted by a python call")  # its failure, if any, is of the past
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_BUDGET_S):
                await entry.closed.wait()
            entry = None
        fresh = entry is None or entry.scope.cancel_called
        if fresh:
            self._refuse_when_stopping()
            self.quotas.take(client.account)
            entry = OpenSandbox(new_sandbox_id(), client, self._python_request, python=True)
            self._python[client] = entry
            self._start_holder(entry)
        assert entry is not None
        await self._opened(entry)
        interpreter = entry.interpreter
        assert interpreter is not None
        with _busy(entry):
            left = interpreter.sandbox.deadline - trio.current_time() - LIFETIME_MARGIN_S
            if left <= 0:
                entry.end("its lifetime passed")
                raise UnknownSandbox("the interpreter's sandbox ends now: call python again")
            try:
                result = await interpreter.run_code(
                    request.code,
                    timeout=min(request.timeout_s, left),
                    max_output=request.max_output,
                    on_output=on_output,
                )
            except InterpreterDied as died:
                raise restart_hint(died) from None
            ports = await interpreter.sandbox.ports()
        return PythonAnswer(result, fresh=fresh, timeout_s=request.timeout_s, ports=ports)

    def _refuse_when_stopping(self) -> None:
        if self._closing.is_set():
            raise HubStopping("the server is stopping; no sandbox is created any more")


@contextmanager
def _busy(entry: OpenSandbox) -> Iterator[None]:
    """A call uses the sandbox: it is not idle."""
    entry.busy += 1
    try:
        yield
    finally:
        entry.busy -= 1
        entry.last_used = trio.current_time()
