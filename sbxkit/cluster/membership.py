"""Which nodes run the batch: Ray says which are alive, sbxkit which may join (I/O shell).

Every alive node that advertises sbxkit resources gets one agent for the batch, pinned to it;
the agent's report, sealed with the cluster secret and bound to a fresh challenge and the node
(``seal.py``), is judged (``join.judge``) and the node is accepted or refused by name. A report
that does not open was not sealed by a holder of the secret: the node is refused, and nothing of
the batch is sent to it. Each node joins on its own: the batch starts once the nodes that
answered have been judged (all of them, or those in by ``START_GRACE_S`` after the first
answer), so a frozen node does not hold it; its join goes on and it is used once accepted. A join
that fails because the agent was lost while its node stays alive (Ray's "temporarily
unavailable", a worker that died) is retried, up to ``JOIN_TRIES`` times, instead of refusing the
node for the rest of the batch. The membership is watched for the whole batch: a node that
appears later joins the same way (against the same image reference), a node Ray reports dead or
whose agent died leaves, and a node whose agent died but that is still alive gets a new agent and
joins again.

A relay task must never run where no accepted agent is: every known sbxkit node that is not
accepted (joining, refused, lost) is excluded by Ray's node-id label in each submission.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from typing import Any

import msgspec
import trio

from sbxkit.cluster.agent import NodeAgent, implementation
from sbxkit.cluster.join import NodeRefusal, image_reference, judge
from sbxkit.cluster.options import ClusterOptions
from sbxkit.cluster.resources import declaration_problem, declared, node_slots
from sbxkit.cluster.seal import Forged, Keys, context
from sbxkit.cluster.wire import JoinRefused, NodeReport, decode_join_reply, decode_report
from sbxkit.errors import ClusterUnavailable

POLL_S = 2.0
"""How often the driver asks Ray for the node list."""
AGENT_CALL_TIMEOUT_S = 30.0
START_GRACE_S = 5.0
"""How long the batch's start waits for the other nodes once one has answered its join."""
JOIN_TRIES = 3
"""Joins of one node per batch that may fail because its agent was lost (the node alive)."""
CHALLENGE_BYTES = 16
ACCEPTED, JOINING, REFUSED, LOST, AGENT_LOST = "accepted", "joining", "refused", "lost", "agent"
RETRY = "retry"
"""Its join failed transiently: it joins again at the next refresh."""
LEFT_OUT = "left out"
"""Not one of the batch's ``nodes``: no agent, and excluded like a refused node."""


class Member(msgspec.Struct, kw_only=True):
    node_id: str
    name: str
    resources: dict[str, float]
    state: str = JOINING
    agent: Any = None
    report: NodeReport | None = None
    tries: int = 0


class Membership:
    poll_s = POLL_S
    start_grace_s = START_GRACE_S

    def __init__(
        self, ray: Any, options: ClusterOptions, terms: bytes, images: list[str], keys: Keys
    ) -> None:
        self.ray = ray
        self.options = options
        self.terms = terms
        self.images = images
        self.keys = keys
        self.members: dict[str, Member] = {}
        self.refusals: dict[str, NodeRefusal] = {}
        self.reference: dict[str, str | None] | None = None
        self._agent_class = ray.remote(NodeAgent)
        self._empty_since: float | None = None
        self._wake = trio.Event()
        self._answered = trio.Event()  # a join ended (start() waits on it)
        self._held: list[NodeReport] = []  # reports in before the image reference is fixed
        self._joins = 0  # joins under way
        self._nursery: trio.Nursery | None = None
        self.stale = False
        """An unverified outcome came back: the driver holds new relays until the next
        refresh has excluded whichever unknown node sent it."""

    # -- what the dispatcher reads ------------------------------------------------------------

    @property
    def accepted(self) -> list[Member]:
        return [m for m in self.members.values() if m.state == ACCEPTED]

    @property
    def capacity(self) -> int:
        """The jobs the accepted nodes run at once, in all (``resources.node_slots``)."""
        return sum(node_slots(m.resources) for m in self.accepted)

    @property
    def largest(self) -> dict[str, float]:
        """Each resource's largest amount on one accepted node."""
        largest: dict[str, float] = {}
        for member in self.accepted:
            for key, amount in member.resources.items():
                largest[key] = max(largest.get(key, 0), amount)
        return largest

    def lacking(self, image: str) -> set[str]:
        """The accepted nodes that do not have ``image`` (its jobs are placed elsewhere)."""
        return {
            m.node_id
            for m in self.accepted
            if m.report is not None and m.report.images.get(image, "") is None
        }

    @property
    def agents(self) -> dict[str, Any]:
        return {m.node_id: m.agent for m in self.accepted}

    @property
    def excluded(self) -> set[str]:
        return {m.node_id for m in self.members.values() if m.state != ACCEPTED}

    def name_of(self, node_id: str | None) -> str | None:
        if node_id is None:
            return None
        member = self.members.get(node_id)
        return member.name if member is not None else node_id[:12]

    def is_accepted(self, node_id: str) -> bool:
        member = self.members.get(node_id)
        return member is not None and member.state == ACCEPTED

    # -- joining ------------------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        """The first join: every sbxkit node alive now, each joining on its own (in
        ``nursery``, for the batch). Returns once the nodes that answered are judged and one is
        accepted; raises ClusterUnavailable when none is (each refusal named)."""
        self._nursery = nursery
        began = trio.current_time()
        first: float | None = None
        await self.refresh()
        while True:
            now = trio.current_time()
            if self._held and first is None:
                first = now
            overdue = now - began >= self.options.join_timeout_s
            graced = first is not None and now - first >= self.start_grace_s
            if self.reference is None and (not self._joins or overdue or graced):
                self._fix_reference()
            if self.reference is not None and (self.accepted or not self._joins or overdue):
                break
            deadline = began + self.options.join_timeout_s
            if first is not None and self.reference is None:
                deadline = min(deadline, first + self.start_grace_s)
            with trio.move_on_at(deadline):
                await self._answered.wait()
            self._answered = trio.Event()
        if not self.accepted:
            wanted = "" if self.options.nodes is None else f" of {sorted(self.options.nodes)}"
            refusals = [str(refusal) for refusal in self.refusals.values()] or [
                f"no alive node{wanted} advertises sbxkit resources "
                '(ray start --resources "$(sbxkit cluster resources)")'
            ]
            raise ClusterUnavailable(
                self.options.address, "no node can run the batch: " + " | ".join(refusals)
            )

    async def watch(self) -> None:
        """Refresh the membership every ``poll_s`` (sooner when woken) for the whole batch."""
        while True:
            with trio.move_on_after(self.poll_s):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.refresh()

    async def refresh(self) -> None:
        # Read-only waits on Ray: a cancelled batch need not wait for them (abandon_on_cancel).
        nodes = await trio.to_thread.run_sync(self.ray.nodes, abandon_on_cancel=True)
        for node in nodes:
            node_id = node["NodeID"]
            resources = declared(node.get("Resources") or {})
            if resources is None:
                continue
            member = self.members.get(node_id)
            if not node.get("Alive", False):
                if member is not None and member.state != REFUSED:
                    member.state = LOST
                continue
            if member is not None and member.state not in (AGENT_LOST, JOINING, RETRY):
                continue
            if member is not None and member.state == JOINING and member.agent is not None:
                continue  # a join under way
            name = node.get("NodeName") or node_id[:12]
            tries = member.tries if member is not None else 0
            member = Member(node_id=node_id, name=name, resources=resources, tries=tries)
            self.members[node_id] = member
            if self.options.nodes is not None and name not in self.options.nodes:
                member.state = LEFT_OUT
                continue
            problem = declaration_problem(resources)
            if problem is not None:
                self._refuse(member, (problem,))
                continue
            member.agent = self._agent_class.options(
                num_cpus=0,
                max_restarts=0,
                max_concurrency=1000,
                scheduling_strategy=self._pinned(node_id),
            ).remote(self.terms, name)
            member.tries += 1
            self._joins += 1
            assert self._nursery is not None
            self._nursery.start_soon(self._join, member, member.agent)
        self.stale = False

    def _pinned(self, node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    async def _join(self, member: Member, agent: Any) -> None:
        try:
            report = await self._joined(member, agent)
        finally:
            self._joins -= 1
            self._answered.set()
        if report is None or member.agent is not agent:
            return  # refused, retried, or the batch moved on
        if self.reference is None:
            self._held.append(report)
        else:
            self._judge([report])

    async def _joined(self, member: Member, agent: Any) -> NodeReport | None:
        """The node's verified report, or None (the node refused or to be retried)."""
        challenge = os.urandom(CHALLENGE_BYTES)
        ref = agent.join.remote(self.images, challenge)
        timeout = self.options.join_timeout_s
        try:
            with trio.move_on_after(timeout):
                data = await _result_of(ref)
                return self._verified(member, data, challenge)
        except self.ray.exceptions.RayActorError as exc:
            if not exc.actor_init_failed and member.tries < JOIN_TRIES:
                self._retry(member)  # the agent was lost, not refused
                return None
            tries = f" (join {member.tries} of {JOIN_TRIES})" if member.tries > 1 else ""
            self._refuse(member, (f"its agent could not start{tries}: {_first_line(exc)}",))
            return None
        except Exception as exc:  # the agent could not start there
            self._refuse(member, (f"its agent could not start: {_first_line(exc)}",))
            return None
        self._refuse(member, (f"its agent did not join within {timeout:g} s",))
        return None

    def _verified(self, member: Member, data: bytes, challenge: bytes) -> NodeReport | None:
        try:
            reply = decode_join_reply(data)
        except msgspec.DecodeError:
            self._refuse(member, ("its agent's join reply is not sbxkit's",))
            return None
        if isinstance(reply, JoinRefused):
            self._refuse(member, (f"it has no usable cluster secret: {reply.reason}",))
            return None
        try:
            sealed = self.keys.open("report", context(challenge, member.node_id), reply.sealed)
            report = decode_report(sealed)
        except (Forged, msgspec.DecodeError):
            self._refuse(
                member,
                (
                    "its join report does not verify against the cluster secret (sealed "
                    "without it, or with another): it is not an sbxkit node of this cluster",
                ),
            )
            return None
        if report.node_id != member.node_id or report.challenge != challenge:
            self._refuse(member, ("its join report names another node or join",))
            return None
        return report

    def _fix_reference(self) -> None:
        """The batch starts: the image reference from the reports in, which are judged."""
        self.reference = image_reference(self._held)
        held, self._held = self._held, []
        self._judge(held)

    def _judge(self, reports: list[NodeReport]) -> None:
        assert self.reference is not None
        accepted, refused = judge(
            reports, implementation=implementation(), reference=self.reference
        )
        for report in accepted:
            member = self.members[report.node_id]
            member.report = report
            member.state = ACCEPTED
        for refusal in refused:
            self._refuse(self.members[refusal.node_id], refusal.reasons)

    def _retry(self, member: Member) -> None:
        member.state = RETRY
        if member.agent is not None:
            self._kill(member.agent)
            member.agent = None

    def _refuse(self, member: Member, reasons: tuple[str, ...]) -> None:
        member.state = REFUSED
        refusal = NodeRefusal(node_id=member.node_id, name=member.name, reasons=reasons)
        member.report = None
        self.refusals[member.node_id] = refusal
        if member.agent is not None:
            self._kill(member.agent)
            member.agent = None
        if self.options.on_refused is not None:
            self.options.on_refused(refusal)

    # -- losing -------------------------------------------------------------------------------

    def node_lost(self, node_id: str) -> None:
        member = self.members.get(node_id)
        if member is not None and member.state == ACCEPTED:
            member.state = LOST

    def agent_lost(self, node_id: str) -> None:
        """The node's agent died: it leaves until a new agent joins (the next refresh)."""
        member = self.members.get(node_id)
        if member is not None and member.state == ACCEPTED:
            member.state = AGENT_LOST
            member.tries = 0
            if member.agent is not None:
                self._kill(member.agent)
                member.agent = None
            self._wake.set()

    def not_accepted(self, node_id: str) -> None:
        """A relay landed on a node without an accepted agent: exclude it, look again."""
        if node_id not in self.members:
            self.members[node_id] = Member(node_id=node_id, name=node_id[:12], resources={})
        self._wake.set()

    def unverified(self) -> None:
        """An outcome that does not verify came back (from a node unknown so far): hold new
        relays until the next refresh, which excludes every node not accepted."""
        self.stale = True
        self._wake.set()

    def check_not_empty(self, waiting: int) -> None:
        """Raise ClusterUnavailable when jobs wait and no node has been accepted for
        ``join_timeout_s``."""
        if not waiting or self.capacity:
            self._empty_since = None
            return
        now = trio.current_time()
        if self._empty_since is None:
            self._empty_since = now
        elif now - self._empty_since > self.options.join_timeout_s:
            raise ClusterUnavailable(
                self.options.address,
                f"no node left to run the batch for {self.options.join_timeout_s:g} s; "
                f"{waiting} jobs wait",
            )

    # -- stopping -----------------------------------------------------------------------------

    async def cancel_runs(self) -> None:
        """Each accepted agent cancels its runs; returns when they have removed their
        containers (or the agents are gone)."""
        calls = [m.agent.cancel_all.remote() for m in self.accepted if m.agent is not None]
        if calls:
            await trio.to_thread.run_sync(
                lambda: self.ray.wait(calls, num_returns=len(calls), timeout=AGENT_CALL_TIMEOUT_S)
            )

    async def stop(self) -> None:
        """Close every accepted agent (engine and trio thread), then end every agent's actor
        (one still joining, on a frozen node say, is not waited for)."""
        closing = [m.agent for m in self.accepted if m.agent is not None]
        calls = [agent.close.remote() for agent in closing]
        if calls:
            await trio.to_thread.run_sync(
                lambda: self.ray.wait(calls, num_returns=len(calls), timeout=AGENT_CALL_TIMEOUT_S)
            )
        for member in self.members.values():
            if member.agent is not None:
                self._kill(member.agent)
                member.agent = None

    def _kill(self, agent: Any) -> None:
        with contextlib.suppress(Exception):  # already gone with its node
            self.ray.kill(agent, no_restart=True)


async def _result_of(ref: Any) -> Any:
    """``ray.get(ref)`` without a thread: the ref's future wakes this task."""
    future: concurrent.futures.Future[Any] = ref.future()
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: concurrent.futures.Future[Any]) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
