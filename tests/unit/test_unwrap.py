"""No exception group escapes a public call: the leaf a caller sees, and the real nursery in
``attached.supervise`` raising an ``EngineError`` and a ``KeyboardInterrupt`` plainly."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel

from sbxkit._lifecycle.attached import supervise
from sbxkit._util.unwrap import chosen_leaf, plain_async, plain_errors
from sbxkit.engine.models import ContainerWaitReply, WaitError
from sbxkit.errors import EngineError, SbxError


def test_ctrl_c_wins_over_everything_else_in_a_group() -> None:
    interrupt = KeyboardInterrupt()
    group = BaseExceptionGroup(
        "x", [EngineError("GET", "/x", 500, "boom"), BaseExceptionGroup("y", [interrupt])]
    )
    assert chosen_leaf(group) is interrupt


def test_the_first_real_error_wins_over_cancellation() -> None:
    error = EngineError("GET", "/x", 500, "boom")
    cancelled = trio.Cancelled._create()  # type: ignore[attr-defined]
    assert chosen_leaf(BaseExceptionGroup("x", [cancelled, error])) is error
    assert chosen_leaf(BaseExceptionGroup("x", [cancelled])) is cancelled


async def test_plain_errors_unwraps_a_nursery_group_keeping_the_leafs_traceback() -> None:
    async def fail() -> None:
        raise EngineError("POST", "wait", 500, "daemon said no")

    with pytest.raises(EngineError) as caught, plain_errors():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
    assert not isinstance(caught.value, BaseExceptionGroup)
    assert caught.value.__traceback__ is not None
    assert any(entry.name == "fail" for entry in caught.traceback)


async def test_without_plain_errors_trio_wraps_even_one_error() -> None:
    # Proves the premise: strict exception groups are on, so the unwrapping is needed.
    async def fail() -> None:
        raise EngineError("POST", "wait", 500, "daemon said no")

    with pytest.raises(BaseExceptionGroup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)


class _SilentAttach:
    """An attach stream that never yields output and accepts stdin."""

    async def receive_some(self, max_bytes: int) -> bytes:
        await trio.sleep_forever()
        return b""

    async def send_all(self, data: bytes) -> None:
        return None

    async def send_eof(self) -> None:
        return None


class _Waiter:
    def __init__(self, reply: ContainerWaitReply | BaseException) -> None:
        self.reply = reply

    async def result(self) -> ContainerWaitReply:
        await trio.lowlevel.checkpoint()
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


async def test_supervise_raises_the_daemons_wait_error_plainly() -> None:
    reply = ContainerWaitReply(status_code=0, error=WaitError(message="container vanished"))
    with pytest.raises(SbxError) as caught:
        await supervise(_SilentAttach(), _Waiter(reply), b"", 1024, 10.0)  # type: ignore[arg-type]
    assert type(caught.value) is EngineError
    assert "container vanished" in str(caught.value)


async def test_supervise_lets_ctrl_c_out_plainly() -> None:
    with pytest.raises(KeyboardInterrupt) as caught:
        await supervise(  # type: ignore[arg-type]
            _SilentAttach(), _Waiter(KeyboardInterrupt()), None, 1024, 10.0
        )
    assert type(caught.value) is KeyboardInterrupt


async def test_plain_async_keeps_the_result_and_the_signature() -> None:
    @plain_async
    async def double(x: int) -> int:
        return 2 * x

    assert await double(21) == 42
