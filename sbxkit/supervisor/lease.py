"""The supervisor's vocabulary for one lease: its peer, its caller's intent, its live state.

``Peer`` is one client connection; ``Intent`` is what the caller has said since it registered
(Started, Close, EOF); ``LiveLease`` is an admitted lease while a task owns it; ``LaunchSlot``
is one of the bounded creates-and-starts in flight.
"""

from __future__ import annotations

import array
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from sbxkit._lifecycle.kernel_watch import Exited, KernelIO
from sbxkit._model.mounts import ExpectedMount
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._model.result import Evidence
from sbxkit._plan.verify import check_created
from sbxkit._protocol.channel import FrameChannel
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import Launch, Message, decode_client, encode
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import Conflict, EngineError, SbxError
from sbxkit.network.governor import Governor


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} sbxkit-supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


class Peer(FrameChannel):
    """One client connection: framed receive, serialised send that tolerates a gone caller."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self._send_lock = trio.Lock()
        self.gone = False
        self.last_payload = b""  # the raw frame of the last message (the re-check reads it)
        self._held: list[Message] = []

    async def receive(self) -> Message | None:
        """The next message, or None at EOF or on a broken connection."""
        payload = await self.receive_payload()
        if payload is None:
            return None
        self.last_payload = payload
        return decode_client(payload)

    def hold(self, message: Message) -> None:
        """Send ``message`` with the next one (or at ``flush``): each write wakes the caller,
        and on two cores its wake takes the CPU from the work that would answer it next."""
        self._held.append(message)

    def _with_held(self, message: Message | None) -> bytes:
        held, self._held = self._held, []
        return b"".join(encode(m) for m in [*held, message] if m is not None)

    async def flush(self) -> None:
        """Send what is held now."""
        if self._held and not self.gone:
            await self._write(self._with_held(None))

    async def send(self, message: Message) -> None:
        if not self.gone:
            await self._write(self._with_held(message))

    async def _write(self, data: bytes) -> None:
        async with self._send_lock:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.gone = True

    async def send_with_fds(self, message: Message, fds: list[int]) -> bool:
        """``message`` with ``fds`` riding along (``SCM_RIGHTS``); the receiver gets its own
        copies. False if the caller is gone (nothing was handed over)."""
        await self.flush()  # what is held goes first, without the descriptors
        if self.gone:
            return False
        frame = encode(message)
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        async with self._send_lock:
            try:
                sent = await self.stream.socket.sendmsg([frame], rights)
                if sent < len(frame):  # the descriptors rode with the first byte
                    await self.stream.send_all(frame[sent:])
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.gone = True
                return False
        return True


class Replies(Protocol):
    """Where a lease's answers go: its caller's connection, or nowhere while it is parked.
    ``hold``: send with the next answer (``Peer.hold``); ``flush``: send what is held now."""

    async def send(self, message: Message) -> None: ...

    def hold(self, message: Message) -> None: ...

    async def flush(self) -> None: ...


class Caller(Replies, Protocol):
    """Who asked for a lease's admission: a client connection (``Peer``), or — for a run
    handed to this supervisor (sbxkit/handoff) — this process itself. ``last_payload`` is the
    raw request as it came (the re-check reads fields the struct would drop)."""

    last_payload: bytes


class NoPeer:
    """A parked pool container has no caller yet: its answers go nowhere until a claim."""

    gone = True

    async def send(self, message: Message) -> None:
        await trio.lowlevel.checkpoint()

    def hold(self, message: Message) -> None:
        pass

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()


class Intent:
    """What the caller has said on its connection since it registered: read by one task,
    seen by the admission wait and the lease task alike."""

    def __init__(self) -> None:
        self.stop = trio.Event()  # close message, caller EOF, lifetime deadline
        self.reason = ""
        self.started = trio.Event()  # the caller started the container
        self.nudge = trio.Event()  # anything changed for a waiting request
        self.detached = trio.Event()  # the caller detached: its connection's end ends nothing

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()
        self.nudge.set()


@dataclass
class ParkedIO:
    """What a kernel path park holds for its claimer: the FIFO streams (and the init's pidfd
    in ``io.init`` when ``evidence`` is ``kernel``)."""

    io: KernelIO
    exited: Exited
    evidence: Evidence

    def fds(self) -> list[int]:
        """In the order ``Claimed`` promises: stdin, stdout, stderr, then the pidfd if held."""
        io = self.io
        own = [io.stdin.fileno(), io.stdout.fileno(), io.stderr.fileno()]
        return own + ([io.init.pidfd] if io.init is not None else [])


class LiveLease:
    def __init__(
        self,
        record: LeaseRecord,
        body: ContainerCreate | None,
        peer: Replies,
        intent: Intent,
        startup_deadline: float,
        lifetime_deadline: float,
        network: NetworkTerms | None = None,
    ) -> None:
        self.record = record
        self.network = network
        """The governed network the lease registered (its governor runs once asked)."""
        self.governor: Governor | None = None
        self.body = body
        """What it was created from; None for a lease re-adopted after a restart."""
        self.peer: Replies = peer
        self.intent = intent
        self.stop = intent.stop
        self.startup_deadline = startup_deadline  # trio clock
        self.lifetime_deadline = lifetime_deadline  # trio clock
        self.finished = trio.Event()
        self.on_created: Callable[[str], Awaitable[None]] | None = None
        """A pool's parking (verify, start, wait for a claim), run once the container exists."""
        self.claimed = trio.Event()  # a parked container was handed to a caller
        self.parked_secret: str | None = None
        """A parked container's secret (its record keeps the hash), handed to its claimer
        (``Claimed.secret``) and then forgotten here."""
        self.parked_io: ParkedIO | None = None
        """A parked container's FIFO ends and init (the kernel path), handed over at its
        claim; this supervisor closes its own copies once parking ends."""
        self.launch: Launch | None = None
        """Start the container once it is verified (``Register.launch``: a kernel path run)."""
        self.kept: trio.Event | None = None
        """Set while the lease is detached (``Detach``): nobody's connection carries it, and
        the event is set when someone reattaches (its keep deadline then stands down)."""
        self.launching: trio.Event | None = None
        """Set once the daemon answered the start this supervisor sent for ``launch``."""

    @property
    def stop_reason(self) -> str:
        return self.intent.reason

    def check_created(
        self,
        info: ContainerInspect,
        container_id: str,
        *,
        expected_mounts: Sequence[ExpectedMount],
        podman: bool,
        image_id: str = "",
        rlimits_by_host: bool = False,
    ) -> None:
        """Raise ContainerMismatch unless ``info`` shows the container this lease's body asked
        for (``verify.check_created``): before a park or a launch starts it."""
        assert self.body is not None  # only a lease created here (not re-adopted) starts one
        check_created(
            info,
            self.body,
            lease=self.record.lease,
            name=self.record.name,
            container_id=container_id,
            expected_mounts=expected_mounts,
            podman=podman,
            image_id=image_id,
            rlimits_by_host=rlimits_by_host,
        )

    def request_stop(self, reason: str) -> None:
        self.intent.request_stop(reason)

    def close_governor(self) -> None:
        """Stop serving the lease's listeners (egress ends with the lease)."""
        if self.governor is not None:
            self.governor.close()


async def first_of(*events: trio.Event) -> None:
    """Return once any of the events is set."""
    async with trio.open_nursery() as nursery:
        for event in events:

            async def wait(event: trio.Event = event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)


def describe(record: LeaseRecord) -> str:
    age = time.time() - record.registered_at
    container = (record.container_id or "-")[:12]
    reason = f" ({record.reason})" if record.reason else ""
    return f"{record.lease} {record.state:<9} container {container} age {age:.0f}s{reason}"


def is_definite_create_failure(error: SbxError) -> bool:
    """The daemon answered the create with an error status: its handler finished and cleaned
    up, so nothing was created. 409 (the name exists) is the exception: a container with this
    lease's name may be ours. A timeout or a lost connection proves nothing either way."""
    return isinstance(error, EngineError) and not isinstance(error, Conflict)


class LaunchSlot:
    """One of the bounded creates-and-starts in flight; released exactly once."""

    def __init__(self, slots: trio.Semaphore) -> None:
        self._slots = slots
        self.held = False

    async def acquire(self) -> None:
        await self._slots.acquire()
        self.held = True

    def try_acquire(self) -> bool:
        """Take a free slot at once, if there is one. None is free while a lease waits (a
        released slot goes straight to the first waiter), so nobody is overtaken."""
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return False
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._slots.release()
