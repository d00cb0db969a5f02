"""The MCP server: the official SDK's low-level ``Server`` with sbxkit's fourteen tools.

Each call is decoded and checked (``sbxkit.mcp.arguments``/``policy``) before the hub creates
anything; every sbxkit error becomes a tool error (``isError`` with the error's type, field,
rule and message), so a model can read what to change, and the server keeps serving. An
unexpected exception is logged and answered the same way: a tool call never ends the server.

Where the hub runs. The SDK is built on anyio. Over stdio it runs on trio, in the same event
loop as sbxkit (``TrioCalls``). Streamable HTTP is served by uvicorn, which runs on asyncio
only, so there the hub lives in a trio thread and every call crosses through a
``sbxkit._util.portal.Portal`` (``PortalCalls``, as ``sbxkit.aio`` does): cancelling the asyncio
side cancels the sbxkit call and waits for its cleanup.

Cancellation and progress. An MCP cancellation (``notifications/cancelled``, or a closed
HTTP response stream) cancels the handler's scope; sbxkit removes the sandbox of a ``run``
(or kills an exec's process group, or interrupts a ``python`` call's code) inside that scope,
shielded, before the handler ends. When the client asked for progress (a ``progressToken``),
``run``, ``sandbox_exec`` and ``python`` send their output as it happens, as progress messages
(``sbxkit.mcp.output_feed``), and every slow tool says how long it has been at it after
``PROGRESS_INTERVAL_S`` without one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import metadata
from typing import Any, Protocol, TypeVar

import anyio
import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError

from sbxkit._util.portal import Portal
from sbxkit.errors import SbxError, Unauthenticated
from sbxkit.mcp.arguments import ARGS, Args, decode_args
from sbxkit.mcp.hub import Caller, Hub
from sbxkit.mcp.output_feed import OutputFeed
from sbxkit.mcp.policy import McpPolicy
from sbxkit.mcp.python_calls import PythonAnswer, python_fields, python_parts
from sbxkit.mcp.schemas import tool_definitions
from sbxkit.mcp.shapes import command_result, error_fields, sandbox_fields

T = TypeVar("T")
Ctx = ServerRequestContext[Any, Any]
logger = logging.getLogger("sbxkit.mcp")

SERVER_NAME = "sbxkit"
PROGRESS_INTERVAL_S = 1.0
FEED_INTERVAL_S = 0.1
"""How often a call's new output goes out as a progress message (its chunks coalesced)."""
STDIO_CALLER = Caller("stdio", "stdio")
"""Over stdio the server has one client: the process that launched it."""
CALLER_SCOPE_KEY = "sbxkit.caller"
"""Where the HTTP gate (``sbxkit.mcp.gate``) leaves a request's ``Caller`` in its ASGI scope."""
INSTRUCTIONS = (
    "Tools that run commands in hardened, disposable Linux sandboxes. Use run for one "
    "command; sandbox_open and then sandbox_write_file, sandbox_exec and sandbox_read_file "
    "for several steps that share files, and sandbox_close when done. For a long-lived shell "
    "or server in an open sandbox, process_start it, then process_write its input and "
    "process_read its output by cursor. For Python whose variables stay between calls (a "
    "notebook), use python. A failing command is a "
    "result (read status and exit_code); a tool error means the call itself was refused, and "
    "its message names the argument and the rule."
)


class Calls(Protocol):
    """How the server reaches the hub's trio code, and keeps the hub running."""

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    def hosting(self, hub: Hub) -> AbstractAsyncContextManager[None]: ...


class TrioCalls:
    """The server runs on trio: call the hub directly, hold it in a nursery."""

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await fn(*args)

    @asynccontextmanager
    async def hosting(self, hub: Hub) -> AsyncIterator[None]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.serve)
            await hub.started.wait()
            try:
                yield
            finally:
                await hub.close()


class PortalCalls:
    """The server runs on asyncio (uvicorn): the hub lives in a portal's trio thread."""

    def __init__(self) -> None:
        self.portal = Portal()

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await self.portal.acall(fn, *args)

    @asynccontextmanager
    async def hosting(self, hub: Hub) -> AsyncIterator[None]:
        self.portal.start()
        self.portal.submit(hub.serve)
        try:
            await self.call(hub.started.wait)
            yield
        finally:
            await self.call(hub.close)
            await anyio.to_thread.run_sync(self.portal.close)


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """Whose quota and sandboxes a call acts on: the stdio peer, or what the HTTP gate
    established from the request's bearer token and the session the server issued (see
    docs/mcp.md, "Who is a client")."""
    request = ctx.request
    if request is None:
        return STDIO_CALLER
    caller = getattr(request, "scope", {}).get(CALLER_SCOPE_KEY)
    if not isinstance(caller, Caller):
        raise Unauthenticated("this request carries no authenticated client")
    return caller


def ok_result(structured: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(structured))],
        structured_content=structured,
        is_error=False,
    )


def error_result(error: SbxError) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=str(error))],
        structured_content=error_fields(error),
        is_error=True,
    )


def wants_progress(ctx: Ctx) -> bool:
    """Whether the client sent a progress token with this request."""
    return ctx.meta is not None and ctx.meta.get("progress_token") is not None


class Progress:
    """One request's progress notifications. The progress value is the seconds since the call
    began, strictly increasing as the protocol asks."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.started = anyio.current_time()
        self.last = 0.0
        self.last_sent_at = self.started

    async def send(self, message: str) -> None:
        now = anyio.current_time()
        self.last = max(now - self.started, self.last + 0.001)
        self.last_sent_at = now
        await self.ctx.session.report_progress(round(self.last, 3), None, message)

    async def send_output(self, feed: OutputFeed, *, final: bool = False) -> None:
        for _, text in feed.take(final=final):
            await self.send(text)


async def with_progress(
    ctx: Ctx,
    work: Callable[[], Awaitable[T]],
    doing: str = "running",
    feed: OutputFeed | None = None,
) -> T:
    """``await work()``, reporting progress meanwhile (a no-op for a client that sent no
    progress token): the output in ``feed`` as it arrives, every ``FEED_INTERVAL_S``, each
    message a run of one stream's text; and, after ``PROGRESS_INTERVAL_S`` without one, how
    long it has been ``doing`` it. The output's last messages are sent before the result.
    Errors leave plainly, not in a group."""
    outcome: list[T] = []
    error: list[Exception] = []
    progress = Progress(ctx)

    async def tick() -> None:
        while True:
            await anyio.sleep(PROGRESS_INTERVAL_S if feed is None else FEED_INTERVAL_S)
            if feed is not None:
                await progress.send_output(feed)
            if anyio.current_time() - progress.last_sent_at >= PROGRESS_INTERVAL_S:
                elapsed = anyio.current_time() - progress.started
                await progress.send(f"{doing} for {elapsed:.0f} s")

    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        try:
            outcome.append(await work())
        except Exception as exc:
            error.append(exc)
        group.cancel_scope.cancel()
    if feed is not None:
        await progress.send_output(feed, final=True)
    if error:
        raise error[0]
    return outcome[0]


SHAPES: dict[str, tuple[Callable[[Any], dict[str, Any]] | None, str | None]] = {
    "run": (command_result, "running"),
    "sandbox_open": (sandbox_fields, "opening"),
    "sandbox_exec": (command_result, "running"),
    "sandbox_write_file": (None, None),
    "sandbox_read_file": (None, None),
    "sandbox_close": (None, None),
    "sandbox_list": (None, None),
    "process_start": (None, None),
    "process_write": (None, None),
    "process_read": (None, None),
    "process_signal": (None, None),
    "process_kill": (None, None),
    "process_list": (None, None),
    "python": (None, "running"),
}
"""Tool → how the hub's answer becomes JSON (None: it already is, or ``python``, which is
content), and what progress says while it runs (None: no progress; it is quick)."""
STREAMING = frozenset({"run", "sandbox_exec", "python"})
"""Tools whose output goes out as progress messages while they run (``on_output``)."""


async def call_hub(ctx: Ctx, hub: Hub, calls: Calls, name: str, client: Caller, args: Args) -> Any:
    """The hub's method of the tool's name, reporting progress for the slow ones, and their
    output as it happens to a client that asked for progress."""
    method = getattr(hub, name)
    shape, doing = SHAPES[name]
    feed = OutputFeed() if name in STREAMING and wants_progress(ctx) else None

    async def work() -> Any:
        if feed is None:
            return await calls.call(method, client, args)
        return await calls.call(method, client, args, feed.add)

    answer = await (work() if doing is None else with_progress(ctx, work, doing, feed))
    return answer if shape is None else shape(answer)


def python_result(answer: PythonAnswer) -> types.CallToolResult:
    """The ``python`` tool's answer: text and images a model reads, the same as JSON; the
    code's exception is an error result (``isError``) carrying its name, value and
    traceback."""
    result = answer.result
    content: list[types.TextContent | types.ImageContent] = []
    for part in python_parts(result, timeout_s=answer.timeout_s, ports=answer.ports):
        if part[0] == "text":
            content.append(types.TextContent(type="text", text=part[1]))
        else:
            content.append(types.ImageContent(type="image", data=part[1], mime_type=part[2]))
    return types.CallToolResult(
        content=list(content),
        structured_content=python_fields(result, fresh=answer.fresh, ports=answer.ports),
        is_error=result.error is not None,
    )


def build_server(policy: McpPolicy, hub: Hub, calls: Calls) -> Server[None]:
    """The SDK server: its lifespan holds the hub (every sandbox removed when it ends)."""
    tools = [types.Tool.model_validate(definition) for definition in tool_definitions(policy)]
    assert list(SHAPES) == [tool.name for tool in tools], "a tool without its shape"

    async def list_tools(
        ctx: ServerRequestContext[None, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[None, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        kind = ARGS.get(params.name)
        if kind is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"unknown tool {params.name!r}; this server has {', '.join(ARGS)}",
            )
        try:
            args = decode_args(params.arguments, kind)
            answer = await call_hub(ctx, hub, calls, params.name, caller_of(ctx), args)
            if isinstance(answer, PythonAnswer):
                return python_result(answer)
            return ok_result(answer)
        except SbxError as exc:
            return error_result(exc)
        except Exception as exc:  # a bug must not end the server: say so, keep serving
            logger.exception("tool %s failed", params.name)
            return error_result(SbxError(f"internal error in {params.name}: {exc!r}"))

    def lifespan(_: Server[None]) -> AbstractAsyncContextManager[None]:
        return calls.hosting(hub)

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _version() -> str:
    try:
        return metadata.version("sbxkit")
    except metadata.PackageNotFoundError:
        return "unknown"
