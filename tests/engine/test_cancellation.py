"""Caller cancellation at every await point of the one-shot lifecycle on the daemon's path
(``SBXKIT_EVIDENCE=daemon``; the kernel path's points: test_cancellation_kernel.py), then
proof nothing leaked.

Modelled on httpcore's ``test_cancellations.py``: an engine subclass calls a hook before and
after each engine call the runner makes (and around the first read of the attach stream and of
the wait reply); the hook cancels the caller's scope at exactly one (point, phase). After each
run the independent witness — never sbxkit — proves that no container of the lease exists and,
for every point before ``container_start``, that the payload never started (the daemon's event
log for the lease has no ``start``).

Two owners. ``InProcessOwner`` (explicit, as in the brief) makes ``container_create`` and
``container_remove`` calls of this very engine, so they are cancel points too. The default
``SupervisedOwner`` creates and removes inside the supervisor process, so its points are the
owner calls themselves (``owner.create`` / ``owner.remove``, through a recording wrapper).

Outcome of each cancel point with ``InProcessOwner`` (``#n`` is the n-th call in one run):

==============================  ==========  ==============================================
point                           phase       ends in
==============================  ==========  ==============================================
image_inspect#1                 before      Cancelled; no container was ever created
image_inspect#1                 after       Cancelled; the create is still sent (known issue,
                                            see test_cancel_before_create_sends_no_create),
                                            the container is removed, never started
container_create#1              before      Cancelled; create is shielded and completes, the
                                            container is removed, never started
container_create#1              after       Cancelled; removed, never started
container_inspect#1             both        Cancelled; removed, never started
container_attach#1              both        Cancelled; removed, never started
container_wait#1                both        Cancelled; removed, never started
container_start#1               before      Cancelled; removed, never started
container_start#1               after       Cancelled; started, then removed (killed)
waiter.result#1                 before      Cancelled; started, then removed
attach.receive_some#1           before      Cancelled; started, then removed
--- reached only by a payload that exits (``true``) ---
attach.receive_some#1           after       Cancelled (the drain wait is a checkpoint)
waiter.result#1                 after       Cancelled (the drain wait is a checkpoint)
container_inspect#2             before      Cancelled; removed
container_inspect#2             after       returns normally: only the shielded removal is
                                            left, and a shielded await delivers no Cancelled
container_remove#1              both        returns normally (removal is shielded and it is
                                            the last await of the run)
==============================  ==========  ==============================================

With ``SupervisedOwner`` the table is the same with ``owner.create#1`` in place of
``container_create#1`` and ``owner.remove#1`` in place of ``container_remove#1``, and without
``container_inspect#1``: the caller verifies the container on the supervisor's post-create
inspection (``Created.inspected``), so its one inspection is the second one above (numbered
``#1`` there). Also ``owner.create#1``/before ends in Cancelled with nothing created (the
supervised create is not shielded: the caller gives up before registering) and
``image_inspect#1``/after likewise creates nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._kernel import initpid
from sbxkit._lifecycle.owner import CreateRequest, InProcessOwner, Owner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import RunResult
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan import plan
from sbxkit.engine import models
from sbxkit.engine.client import Deadlines, Engine, Waiter, negotiate
from sbxkit.engine.discovery import parse_api_version, ping_socket
from sbxkit.engine.transport import HijackedStream, Transport
from tests.engine.helpers import ForwardingOwner
from tests.witness import LEASE_LABEL, Witness

Point = tuple[str, str]
OwnerKind = Literal["in-process", "supervised", "launched"]
"""``launched``: the supervised owner as a kernel path run meets it by default — it starts the
container itself once verified (``LaunchingHookedOwner``); ``supervised`` wraps it without
that, as a run whose caller starts its container (a governed network's) meets it."""


@pytest.fixture(autouse=True)
def _daemon_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """These points are the daemon's path's (attach, wait); the kernel path has its own."""
    if request.module.__name__.endswith("test_cancellation"):
        monkeypatch.setenv("SBXKIT_EVIDENCE", "daemon")


@pytest.fixture(autouse=True)
def every_run_asks_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run here plans on a fresh inspection of its image (``image_inspect#1``) and, on
    the kernel path, reads its init's pid from State.Pid (``container_inspect#2``): points to
    cancel at. A process that ran the image (or the daemon's containers) moments earlier skips
    them (sbxkit/_plan/plan.py ``check_image``, sbxkit/_kernel/initpid.py) without a new await."""
    monkeypatch.setattr(plan, "_image_facts", {})
    monkeypatch.setattr(initpid, "_layouts", {})


# A cancelled run must be over well within this (removal of a running container included).
QUICK_S = 10.0

# Cancel points reached by a payload that never exits on its own (``sleep 30``), in the order
# the runner reaches them.
PRE_START: list[Point] = [
    ("image_inspect#1", "before"),
    ("image_inspect#1", "after"),
    ("container_create#1", "before"),
    ("container_create#1", "after"),
    ("container_inspect#1", "before"),
    ("container_inspect#1", "after"),
    ("container_attach#1", "before"),
    ("container_attach#1", "after"),
    ("container_wait#1", "before"),
    ("container_wait#1", "after"),
    ("container_start#1", "before"),
]
POST_START: list[Point] = [
    ("container_start#1", "after"),
    ("waiter.result#1", "before"),
    ("attach.receive_some#1", "before"),
]
SLOW_POINTS = PRE_START + POST_START
# Reached only when the payload exits by itself (``true``).
EXIT_POINTS: list[Point] = [
    ("attach.receive_some#1", "after"),
    ("waiter.result#1", "after"),
    ("container_inspect#2", "before"),
    ("container_inspect#2", "after"),
    ("container_remove#1", "before"),
    ("container_remove#1", "after"),
]
FAST_POINTS = SLOW_POINTS + EXIT_POINTS
# After these nothing cancellable is left: run() returns its result despite the cancel.
RETURNS_NORMALLY: set[Point] = {
    ("container_inspect#2", "after"),
    ("container_remove#1", "before"),
    ("container_remove#1", "after"),
    ("owner.remove#1", "before"),
    ("owner.remove#1", "after"),
}
# The supervised owner's calls replace the engine's create and remove; its Created carries
# the post-create inspection, so the caller's first inspection is not made (None) and the
# second is its first.
SUPERVISED_NAMES: dict[str, str | None] = {
    "container_create#1": "owner.create#1",
    "container_remove#1": "owner.remove#1",
    "container_inspect#1": None,
    "container_inspect#2": "container_inspect#1",
}
# Points at which nothing may have been created yet, per owner.
NOTHING_CREATED: dict[OwnerKind, set[Point]] = {
    "in-process": {("image_inspect#1", "before")},
    "supervised": {
        ("image_inspect#1", "before"),
        ("image_inspect#1", "after"),
        ("owner.create#1", "before"),
    },
}
NOTHING_CREATED["launched"] = NOTHING_CREATED["supervised"]


def supervised(points: list[Point]) -> list[Point]:
    """``points`` as the supervised owner passes them."""
    renamed = [(SUPERVISED_NAMES.get(name, name), phase) for name, phase in points]
    return [(name, phase) for name, phase in renamed if name is not None]


def pre_start(owner: OwnerKind) -> list[Point]:
    return PRE_START if owner == "in-process" else supervised(PRE_START)


def point_id(point: Point) -> str:
    return f"{point[0]}-{point[1]}"


class HookedWaiter(Waiter):
    """The runner's wait registration, with hooks around ``result()``."""

    def __init__(self, inner: Waiter, engine: CancellingEngine) -> None:
        super().__init__(inner._stream, inner._path)
        self._engine = engine

    async def result(self) -> models.ContainerWaitReply:
        name = self._engine.numbered("waiter.result")
        self._engine.hook(name, "before")
        reply = await super().result()
        self._engine.hook(name, "after")
        return reply


class HookedAttach(HijackedStream):
    """The runner's attach stream, with hooks around every read and a byte count."""

    def __init__(self, inner: HijackedStream, engine: CancellingEngine) -> None:
        # Take over the inner stream's state (socket, replayed bytes) rather than re-hijack.
        self.__dict__.update(vars(inner))
        self._engine = engine

    async def receive_some(self, max_bytes: int = 64 * 1024) -> bytes:
        name = self._engine.numbered("attach.receive_some")
        self._engine.hook(name, "before")
        data = await super().receive_some(max_bytes)
        self._engine.output_bytes += len(data)
        if data:
            self._engine.first_output.set()
        self._engine.hook(name, "after")
        return data


class HookedOwner(ForwardingOwner):
    """Wraps an owner: hooks around its calls, and the lease they were given."""

    def __init__(self, inner: Owner, engine: CancellingEngine) -> None:
        super().__init__(inner)
        self._engine = engine

    async def create(self, request: CreateRequest) -> str:
        point = self._engine.numbered("owner.create")
        self._engine.owner_leases.append(request.lease)
        self._engine.hook(point, "before")
        container_id = await self._inner.create(request)
        self._engine.created_ids.append(container_id)
        self._engine.hook(point, "after")
        return container_id

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        point = self._engine.numbered("owner.remove")
        self._engine.hook(point, "before")
        await self._inner.remove(lease, name, container_id)
        self._engine.hook(point, "after")


class LaunchingHookedOwner(HookedOwner):
    """A ``HookedOwner`` of a ``SupervisedOwner`` that starts a kernel path container itself
    (``LaunchingOwner``): hooks around its launch calls, and the start it made counted as the
    engine's (``start_attempts`` once sent, ``started_ids`` once the daemon answered)."""

    launches = True

    def __init__(self, inner: SupervisedOwner, engine: CancellingEngine) -> None:
        super().__init__(inner, engine)
        self._launcher = inner

    async def create(self, request: CreateRequest) -> str:
        point = self._engine.numbered("owner.create")
        self._engine.owner_leases.append(request.lease)
        self._engine.hook(point, "before")
        container_id = await self._launcher.create(request)
        self._engine.created_ids.append(container_id)
        if self._launcher.launching(request.lease):
            self._engine.start_attempts.append(container_id)
        self._engine.hook(point, "after")
        return container_id

    def launching(self, lease: str) -> bool:
        return self._launcher.launching(lease)

    async def said_or_launched(
        self, lease: str, container_id: str, said: Callable[[], Awaitable[None]]
    ) -> bool:
        point = self._engine.numbered("owner.said_or_launched")
        self._engine.hook(point, "before")
        first = await self._launcher.said_or_launched(lease, container_id, said)
        if not first:
            self._engine.started_ids.append(container_id)
        self._engine.hook(point, "after")
        return first

    async def launch_answer(self, lease: str, container_id: str) -> None:
        point = self._engine.numbered("owner.launch_answer")
        self._engine.hook(point, "before")
        await self._launcher.launch_answer(lease, container_id)
        if container_id not in self._engine.started_ids:
            self._engine.started_ids.append(container_id)
        self._engine.hook(point, "after")


class CancellingEngine(Engine):
    """An Engine that cancels ``scope`` when the lifecycle reaches ``target``.

    Every overridden call is ``hook(name#n, "before")``, the real call, ``hook(name#n,
    "after")``; the hook is synchronous, so the cancel is delivered at the next checkpoint.
    With a ``delay`` the hook only sets ``reached`` and the test cancels that much later.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.target: Point | None = None
        self.scope: trio.CancelScope | None = None
        self.delayed = False
        self.reached = trio.Event()
        self.fired = False
        self.log: list[Point] = []
        self.counts: Counter[str] = Counter()
        self.create_names: list[str] = []
        self.owner_leases: list[str] = []
        self.created_ids: list[str] = []
        self.start_attempts: list[str] = []  # start requests begun (may be cut short)
        self.started_ids: list[str] = []  # start requests the daemon confirmed
        self.removed: list[tuple[str, bool]] = []
        self.output_bytes = 0
        self.first_output = trio.Event()

    def arm(self, target: Point | None, scope: trio.CancelScope, *, delayed: bool) -> None:
        self.target = target
        self.scope = scope
        self.delayed = delayed

    def numbered(self, method: str) -> str:
        self.counts[method] += 1
        return f"{method}#{self.counts[method]}"

    def hook(self, name: str, phase: str) -> None:
        self.log.append((name, phase))
        if (name, phase) == self.target and self.scope is not None:
            self.reached.set()
            if not self.delayed:
                self.scope.cancel()
                self.fired = True

    @property
    def lease(self) -> str | None:
        """The lease: from the ``name=`` given to ``container_create`` (``sbxkit-<lease>``),
        or, with the supervised owner, from the owner call."""
        if self.create_names:
            name = self.create_names[0]
            assert name.startswith("sbxkit-"), name
            return name.removeprefix("sbxkit-")
        return self.owner_leases[0] if self.owner_leases else None

    async def image_inspect(self, name: str) -> models.ImageInspect:
        point = self.numbered("image_inspect")
        self.hook(point, "before")
        reply = await super().image_inspect(name)
        self.hook(point, "after")
        return reply

    async def container_create(self, body: models.ContainerCreate, *, name: str) -> str:
        point = self.numbered("container_create")
        self.create_names.append(name)
        self.hook(point, "before")
        container_id = await super().container_create(body, name=name)
        self.created_ids.append(container_id)
        self.hook(point, "after")
        return container_id

    async def container_inspect(self, container: str) -> models.ContainerInspect:
        point = self.numbered("container_inspect")
        self.hook(point, "before")
        reply = await super().container_inspect(container)
        self.hook(point, "after")
        return reply

    async def container_attach(self, container_id: str, *, stdin: bool) -> HijackedStream:
        point = self.numbered("container_attach")
        self.hook(point, "before")
        stream = await super().container_attach(container_id, stdin=stdin)
        self.hook(point, "after")
        return HookedAttach(stream, self)

    async def container_wait(self, container_id: str, condition: str = "next-exit") -> Waiter:
        point = self.numbered("container_wait")
        self.hook(point, "before")
        waiter = await super().container_wait(container_id, condition)
        self.hook(point, "after")
        return HookedWaiter(waiter, self)

    async def container_start(self, container_id: str) -> None:
        point = self.numbered("container_start")
        self.start_attempts.append(container_id)
        self.hook(point, "before")
        await super().container_start(container_id)
        self.started_ids.append(container_id)
        self.hook(point, "after")

    async def container_remove(self, container_id: str) -> bool:
        point = self.numbered("container_remove")
        self.hook(point, "before")
        removed = await super().container_remove(container_id)
        self.removed.append((container_id, removed))
        self.hook(point, "after")
        return removed


@asynccontextmanager
async def cancelling_engine(path: str) -> AsyncIterator[CancellingEngine]:
    """Built the way ``connect()`` builds an Engine."""
    ping = await ping_socket(path, timeout=5)
    engine = CancellingEngine(
        Transport(path), ping, negotiate(parse_api_version(ping.api_version)), Deadlines()
    )
    try:
        yield engine
    finally:
        await engine.aclose()


def make_spec(image: str, command: list[str], *, output_bytes: int = MiB) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=command,
        limits=Limits(
            cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=output_bytes, timeout_s=60.0
        ),
    )


def make_owner(kind: OwnerKind, engine: CancellingEngine) -> Owner:
    if kind == "in-process":
        return InProcessOwner(engine)
    if kind == "launched":
        return LaunchingHookedOwner(SupervisedOwner(engine), engine)
    return HookedOwner(SupervisedOwner(engine), engine)


def lease_events(witness: Witness, lease: str, since: float) -> list[dict[str, Any]]:
    """The daemon's container events for this lease, in order (witness, not sbxkit)."""
    return witness.events(since, time.time(), type=["container"], label=[f"{LEASE_LABEL}={lease}"])


def lease_actions(witness: Witness, lease: str, since: float) -> list[str]:
    return [str(e.get("Action") or e.get("status")) for e in lease_events(witness, lease, since)]


class Outcome:
    def __init__(self) -> None:
        self.result: RunResult | None = None
        self.cancelled = False
        self.elapsed = 0.0


async def run_with_cancel(
    engine: CancellingEngine,
    spec: SandboxSpec,
    target: Point | None,
    *,
    owner: OwnerKind = "in-process",
    delay: float | None = None,
) -> Outcome:
    """``run()`` inside a scope that is cancelled at ``target`` (``delay`` seconds later)."""
    outcome = Outcome()
    scope = trio.CancelScope()
    engine.arm(target, scope, delayed=delay is not None)
    # fail_after is a backstop only: a hang fails the test instead of wedging the suite.
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            if delay is not None:

                async def cancel_later() -> None:
                    await engine.reached.wait()
                    await trio.sleep(delay)
                    scope.cancel()
                    engine.fired = True

                nursery.start_soon(cancel_later)
            t0 = trio.current_time()
            with scope:
                outcome.result = await run(spec, engine=engine, owner=make_owner(owner, engine))
            outcome.elapsed = trio.current_time() - t0
            nursery.cancel_scope.cancel()
    outcome.cancelled = scope.cancelled_caught
    return outcome


def assert_gone(witness: Witness, engine: CancellingEngine, since: float) -> list[str]:
    """Witness: no container of the lease exists; returns the lease's event actions."""
    lease = engine.lease
    assert lease is not None, "no lease was ever handed to the owner"
    assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []
    actions = lease_actions(witness, lease, since)
    assert actions.count("create") == actions.count("destroy") <= 1, actions
    # Whatever started was started by this runner's own start call, or by the one its owner
    # sent for it (a launched kernel path run): no other start.
    assert len(engine.started_ids) <= actions.count("start") <= len(engine.start_attempts)
    assert actions.count("start") <= 1, actions
    return actions


def assert_gone_and_started(
    witness: Witness, engine: CancellingEngine, since: float, *, started: bool
) -> None:
    """Witness: the lease's container was created, is gone, and did (not) start."""
    actions = assert_gone(witness, engine, since)
    # Positive controls: the label filter does match this lease's events.
    assert "create" in actions, actions
    assert "destroy" in actions, actions
    assert engine.created_ids, "create did not complete"
    if started:
        assert "start" in actions, actions
    else:
        assert "start" not in actions, actions
        assert engine.started_ids == []


def expect_outcome(point: Point, outcome: Outcome, owner: OwnerKind) -> None:
    assert outcome.elapsed < QUICK_S, f"cancelled run took {outcome.elapsed:.1f} s"
    returns = RETURNS_NORMALLY if owner == "in-process" else supervised(list(RETURNS_NORMALLY))
    if point in returns:
        assert not outcome.cancelled
        assert outcome.result is not None
        assert outcome.result.status == "exited"
        assert outcome.result.exit_code == 0
    else:
        assert outcome.cancelled, f"{point}: run() returned {outcome.result!r}"
        assert outcome.result is None


def ended_before_create(
    witness: Witness, engine: CancellingEngine, since: float, point: Point, owner: OwnerKind
) -> bool:
    """Checks a run cancelled before any container existed (on either path): True when the
    point is one, and nothing was created, started or left."""
    if point in NOTHING_CREATED[owner]:
        assert engine.create_names == []  # this engine was never asked to create
        assert engine.created_ids == []
        assert engine.removed == []
        if engine.lease is not None:
            assert lease_actions(witness, engine.lease, since) == []
        return True
    if owner == "in-process" and point == ("image_inspect#1", "after"):
        # The create is still sent after this cancel (the known issue, pinned by
        # test_cancel_before_create_sends_no_create); either way nothing may be left and
        # nothing may have started.
        if engine.create_names:
            assert_gone_and_started(witness, engine, since, started=False)
        else:
            assert engine.removed == []
        return True
    return False


async def check_point(
    witness: Witness, busybox: str, command: list[str], point: Point, owner: OwnerKind
) -> None:
    since = time.time()
    async with cancelling_engine(witness.socket_path) as engine:
        outcome = await run_with_cancel(engine, make_spec(busybox, command), point, owner=owner)
        assert engine.fired, f"{point} was never reached; calls: {engine.log}"
        expect_outcome(point, outcome, owner)
        before_start = point in pre_start(owner)
        if ended_before_create(witness, engine, since, point, owner):
            return
        assert_gone_and_started(witness, engine, since, started=not before_start)
        if owner == "in-process":
            assert [cid for cid, _ in engine.removed][:1] == engine.created_ids


@pytest.mark.parametrize("point", SLOW_POINTS, ids=point_id)
async def test_cancel_long_running_payload(witness: Witness, busybox: str, point: Point) -> None:
    await check_point(witness, busybox, ["sh", "-c", "sleep 30"], point, "in-process")


@pytest.mark.parametrize("point", FAST_POINTS, ids=point_id)
async def test_cancel_exiting_payload(witness: Witness, busybox: str, point: Point) -> None:
    await check_point(witness, busybox, ["true"], point, "in-process")


@pytest.mark.parametrize("point", supervised(SLOW_POINTS), ids=point_id)
async def test_cancel_long_running_payload_supervised(
    witness: Witness, busybox: str, point: Point
) -> None:
    await check_point(witness, busybox, ["sh", "-c", "sleep 30"], point, "supervised")


@pytest.mark.parametrize("point", supervised(EXIT_POINTS), ids=point_id)
async def test_cancel_exiting_payload_supervised(
    witness: Witness, busybox: str, point: Point
) -> None:
    await check_point(witness, busybox, ["true"], point, "supervised")


@pytest.mark.parametrize("owner", ["in-process", "supervised"])
async def test_point_lists_cover_every_hook_of_a_run(
    witness: Witness, busybox: str, owner: OwnerKind
) -> None:
    """An uncancelled ``true`` run passes exactly the listed points, in lifecycle order, so the
    parametrizations above cannot silently miss an engine call the runner starts making."""
    since = time.time()
    async with cancelling_engine(witness.socket_path) as engine:
        outcome = await run_with_cancel(engine, make_spec(busybox, ["true"]), None, owner=owner)
        assert outcome.result is not None
        assert outcome.result.ok
        assert not engine.fired
        # Every hook fired, once; only the attach stream is read more than once.
        seen = [p for p in engine.log if not p[0].startswith("attach.receive_some#")]
        seen += [p for p in engine.log if p[0] == "attach.receive_some#1"]
        expected = FAST_POINTS if owner == "in-process" else supervised(FAST_POINTS)
        assert sorted(seen) == sorted(expected)
        calls = [
            name
            for name, phase in engine.log
            if phase == "before" and not name.startswith(("attach.", "waiter."))
        ]
        lifecycle = [
            "image_inspect#1",
            "container_create#1",
            "container_inspect#1",
            "container_attach#1",
            "container_wait#1",
            "container_start#1",
            "container_inspect#2",
            "container_remove#1",
        ]
        if owner == "supervised":
            lifecycle = [name for name, _ in supervised([(name, "before") for name in lifecycle])]
        assert calls == lifecycle
        assert_gone_and_started(witness, engine, since, started=True)


async def test_cancel_before_create_sends_no_create(witness: Witness, busybox: str) -> None:
    """Cancelled after the image check, before the create request exists: the one-shot lifecycle
    (docs/architecture.md, step 3) shields only creation that is already under way, so no create
    should reach the daemon."""
    async with cancelling_engine(witness.socket_path) as engine:
        outcome = await run_with_cancel(
            engine, make_spec(busybox, ["sh", "-c", "sleep 30"]), ("image_inspect#1", "after")
        )
        assert outcome.cancelled
        assert engine.create_names == []


async def test_cancel_during_shielded_create(witness: Witness, busybox: str) -> None:
    """The caller gives up while the create request is under way: the create still completes
    (the id is needed to clean up), then the container is removed and never started."""
    since = time.time()
    async with cancelling_engine(witness.socket_path) as engine:
        outcome = await run_with_cancel(
            engine, make_spec(busybox, ["sh", "-c", "sleep 30"]), ("container_create#1", "before")
        )
        assert outcome.cancelled
        assert outcome.elapsed < QUICK_S
        # The create ran to completion inside the shield ...
        assert ("container_create#1", "after") in engine.log
        assert len(engine.created_ids) == 1
        # ... the runner's next engine call was cancelled before it reached the daemon ...
        assert ("container_inspect#1", "before") in engine.log
        assert ("container_inspect#1", "after") not in engine.log
        assert engine.counts["container_start"] == 0
        # ... and exactly the created id was removed, never started.
        assert engine.removed == [(engine.created_ids[0], True)]
        assert_gone_and_started(witness, engine, since, started=False)
        lease = engine.lease
        assert lease is not None
        destroyed = [
            e
            for e in lease_events(witness, lease, since)
            if (e.get("Action") or e.get("status")) == "destroy"
        ]
        assert [e["id"] for e in destroyed] == engine.created_ids


@pytest.mark.parametrize("delay", [0.0, 0.005, 0.01, 0.02, 0.04, 0.08])
@pytest.mark.parametrize("owner", ["in-process", "supervised"])
async def test_cancel_while_create_is_in_flight(
    witness: Witness, busybox: str, owner: OwnerKind, delay: float
) -> None:
    """A timer cancels ``delay`` s after the create began, so the cancel lands while the
    create (or, for the supervisor, registration or the create it runs) is in flight. Whatever
    was created is gone, and a payload started only if the runner itself sent start."""
    name = "container_create#1" if owner == "in-process" else "owner.create#1"
    since = time.time()
    async with cancelling_engine(witness.socket_path) as engine:
        outcome = await run_with_cancel(
            engine,
            make_spec(busybox, ["sh", "-c", "sleep 30"]),
            (name, "before"),
            owner=owner,
            delay=delay,
        )
        assert engine.fired
        assert outcome.cancelled
        assert outcome.elapsed < QUICK_S
        actions = assert_gone(witness, engine, since)
        if owner == "in-process":
            assert len(engine.created_ids) == 1  # the shielded create always completes
            assert "destroy" in actions


async def test_cancel_while_output_is_streaming(witness: Witness, busybox: str) -> None:
    """``yes`` floods the attach stream; the caller cancels 0.3 s into the flood."""
    since = time.time()
    spec = make_spec(busybox, ["yes"], output_bytes=512 * MiB)
    async with cancelling_engine(witness.socket_path) as engine:
        outcome = Outcome()
        bytes_at_cancel = 0
        t0 = trio.current_time()
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()

                async def canceller() -> None:
                    nonlocal bytes_at_cancel
                    await engine.first_output.wait()
                    await trio.sleep(0.3)
                    bytes_at_cancel = engine.output_bytes
                    scope.cancel()

                nursery.start_soon(canceller)
                with scope:
                    outcome.result = await run(spec, engine=engine, owner=InProcessOwner(engine))
        elapsed = trio.current_time() - t0
        assert scope.cancelled_caught
        assert outcome.result is None
        assert elapsed < QUICK_S
        # The cancel landed mid-stream: output was flowing and far from the cap.
        assert bytes_at_cancel > 64 * 1024
        assert bytes_at_cancel < 512 * MiB
        assert_gone_and_started(witness, engine, since, started=True)
        assert [cid for cid, _ in engine.removed] == engine.created_ids
