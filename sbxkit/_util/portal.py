"""A trio event loop in a worker thread, for callers that are not trio: plain code, notebooks,
asyncio.

sbxkit is trio-native. A ``Portal`` runs ``trio.run`` in its own thread and executes sbxkit
coroutines there, each in its own cancel scope, so a caller in another world can *cancel* one —
and cancellation in sbxkit means the container is removed before the call returns. Both ways of
waiting honour that:

- ``call`` (blocking): Ctrl-C while waiting cancels the call, waits for its cleanup (further
  Ctrl-Cs only wait harder), then raises a plain ``KeyboardInterrupt``;
- ``acall`` (asyncio): cancelling the asyncio task cancels the call and waits for its cleanup
  before ``CancelledError`` propagates — so when ``task.cancel(); await task`` returns, the
  container is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import trio

from sbxkit.errors import CallCancelled, PortalClosed

T = TypeVar("T")


class PortalCall(Generic[T]):
    """One coroutine call: run in the portal's trio thread, awaited from another thread."""

    def __init__(
        self, portal: Portal, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]
    ) -> None:
        self._portal = portal
        self.fn = fn
        self.args = args
        self.scope = trio.CancelScope()
        self.finished = threading.Event()
        self._result: T | None = None
        self.error: BaseException | None = None
        self.on_finish: Callable[[], object] | None = None

    async def _run(self) -> None:
        with self.scope:
            try:
                self._result = await self.fn(*self.args)
            except Exception as exc:
                self.error = exc
        if self.scope.cancelled_caught and self.error is None:
            self.error = CallCancelled("the call was cancelled")
        self.finished.set()
        if self.on_finish is not None:
            self.on_finish()

    def cancel(self) -> None:
        """Cancel the call (its cleanup still runs); returns at once."""
        self._portal._cancel(self)

    def wait(self) -> None:
        """Block until the call is done; Ctrl-C (or any exception) while waiting cancels it
        and waits for its cleanup before propagating."""
        try:
            self.finished.wait()
        except BaseException:
            self.cancel()
            _wait_through_interrupts(self.finished)
            raise

    def result(self) -> T:
        """The call's return value, or its exception raised. Only after ``wait``."""
        if self.error is not None:
            raise self.error
        return self._result  # type: ignore[return-value]


class Portal:
    """``with Portal() as portal: portal.call(sbxkit.run, spec)`` — see the module doc.

    Calls may overlap (each has its own task); closing waits for every call still running.
    """

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._send: trio.MemorySendChannel[PortalCall[Any]] | None = None
        self._ready = threading.Event()
        self._crashed: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="sbxkit-trio", daemon=True)

    def __enter__(self) -> Portal:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._token is None:
            raise PortalClosed(f"the trio thread did not start: {self._crashed!r}")

    def _thread_main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # a bug in the portal itself; reported by start/submit
            self._crashed = exc
        finally:
            self._token = None
            self._ready.set()

    async def _serve(self) -> None:
        send, receive = trio.open_memory_channel[PortalCall[Any]](math.inf)
        self._send = send
        self._token = trio.lowlevel.current_trio_token()
        self._ready.set()
        async with trio.open_nursery() as nursery, receive:
            async for call in receive:
                nursery.start_soon(call._run)

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> PortalCall[T]:
        """Start ``await fn(*args)`` in the trio thread; returns at once."""
        call: PortalCall[T] = PortalCall(self, fn, args)
        self._submit(call)
        return call

    def _submit(self, call: PortalCall[Any]) -> None:
        token, send = self._token, self._send
        if token is None or send is None:
            raise PortalClosed("the portal is closed")
        try:
            trio.from_thread.run_sync(send.send_nowait, call, trio_token=token)
        except (trio.RunFinishedError, trio.ClosedResourceError):
            raise PortalClosed("the portal is closed") from None

    def run_sync(self, fn: Callable[[], object]) -> None:
        """Call a synchronous ``fn`` in the trio thread (e.g. setting a ``trio.Event``)."""
        token = self._token
        if token is None:
            raise PortalClosed("the portal is closed")
        try:
            trio.from_thread.run_sync(fn, trio_token=token)
        except trio.RunFinishedError:
            raise PortalClosed("the portal is closed") from None

    def _cancel(self, call: PortalCall[Any]) -> None:
        token = self._token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(call.scope.cancel, trio_token=token)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the trio thread and block until it is done.

        A ``KeyboardInterrupt`` (or any exception) raised while waiting cancels the call and
        waits for its cleanup before it propagates.
        """
        call = self.submit(fn, *args)
        call.wait()
        return call.result()

    async def acall(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in the trio thread from asyncio code.

        Cancelling the awaiting asyncio task cancels the call; ``CancelledError`` propagates
        only after the call's cleanup (the container's removal) has finished.
        """
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        call: PortalCall[T] = PortalCall(self, fn, args)
        call.on_finish = lambda: loop.call_soon_threadsafe(_resolve, finished)
        self._submit(call)
        try:
            await asyncio.shield(finished)
        except asyncio.CancelledError:
            self._cancel(call)
            while not finished.done():
                try:
                    await asyncio.shield(finished)
                except asyncio.CancelledError:
                    continue  # cleanup first: a repeated cancel waits for the same removal
            raise
        return call.result()

    def close(self) -> None:
        """Stop accepting calls, wait for the running ones, end the trio thread."""
        token, send = self._token, self._send
        if token is not None and send is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(send.close, trio_token=token)
        if self._thread.is_alive():
            _wait_through_interrupts(self._thread)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wait_through_interrupts(waitable: threading.Event | threading.Thread) -> None:
    """Wait for cleanup to finish even if Ctrl-C is pressed again; re-raise one Ctrl-C after."""
    interrupted = False
    while True:
        try:
            if isinstance(waitable, threading.Thread):
                waitable.join()
            else:
                waitable.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
