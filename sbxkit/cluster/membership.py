"""Which nodes run the batch: Ray says which are alive, sbxkit which may join (I/O shell).

Every alive node that advertises sbxkit resources gets one agent for the batch, pinned to it;
the agent's ``NodeReport`` is judged (``join.judge``) and the node is accepted or refused by
name. The membership is watched for the whole batch: a node that appears later joins the same
way (against the same image reference), a node Ray reports dead or whose agent died leaves,
and a node whose agent died but that is still alive gets a new agent and joins again.

A relay task must never run where no accepted agent is: every known sbxkit node that is not
accepted (joining, refused, lost) is excluded by Ray's node-id label in each submission.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import trio

from sbxkit.cluster.agent import NodeAgent, implementation
from sbxkit.cluster.join import NodeRefusal, image_reference, judge
from sbxkit.cluster.options import ClusterOptions, ClusterUnavailable
from sbxkit.cluster.resources import SANDBOXES, declaration_problem, declared
from sbxkit.cluster.wire import NodeReport, decode_report

POLL_S = 2.0
"""How often the driver asks Ray for the node list."""
AGENT_CALL_TIMEOUT_S = 30.0
ACCEPTED, JOINING, REFUSED, LOST, AGENT_LOST = "accepted", "joining", "refused", "lost", "agent"
LEFT_OUT = "left out"
"""Not one of the batch's ``nodes``: no agent, and excluded like a refused node."""


class Member(msgspec.Struct, kw_only=True):
    node_id: str
    name: str
    resources: dict[str, float]
    state: str = JOINING
    agent: Any = None
    report: NodeReport | None = None


class Membership:
    poll_s = POLL_S

    def __init__(self, ray: Any, options: ClusterOptions, terms: bytes, images: list[str]) -> None:
        self.ray = ray
        self.options = options
        self.terms = terms
        self.images = images
        self.members: dict[str, Member] = {}
        self.refusals: dict[str, NodeRefusal] = {}
        self.reference: dict[str, str | None] | None = None
        self._agent_class = ray.remote(NodeAgent)
        self._empty_since: float | None = None
        self._wake = trio.Event()

    # -- what the dispatcher reads ------------------------------------------------------------

    @property
    def accepted(self) -> list[Member]:
        return [m for m in self.members.values() if m.state == ACCEPTED]

    @property
    def capacity(self) -> int:
        """The sandboxes the accepted nodes advertise, in all."""
        return int(sum(m.resources.get(SANDBOXES, 0) for m in self.accepted))

    @property
    def largest(self) -> dict[str, float]:
        """Each resource's largest amount on one accepted node."""
        largest: dict[str, float] = {}
        for member in self.accepted:
            for key, amount in member.resources.items():
                largest[key] = max(largest.get(key, 0), amount)
        return largest

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

    # -- joining ------------------------------------------------------------------------------

    async def start(self) -> None:
        """The first join: every sbxkit node alive now. Raises ClusterUnavailable when none
        is accepted (each refusal named)."""
        await self.refresh()
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
        joining: dict[str, Any] = {}
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
            if member is not None and member.state not in (AGENT_LOST, JOINING):
                continue
            if member is not None and member.state == JOINING and member.agent is not None:
                continue  # a join under way (another refresh's)
            name = node.get("NodeName") or node_id[:12]
            member = Member(node_id=node_id, name=name, resources=resources)
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
            joining[node_id] = member.agent.join.remote(self.images)
        if joining:
            await self._collect(joining)

    def _pinned(self, node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    async def _collect(self, joining: dict[str, Any]) -> None:
        refs = list(joining.values())
        ready, _ = await trio.to_thread.run_sync(
            lambda: self.ray.wait(refs, num_returns=len(refs), timeout=self.options.join_timeout_s),
            abandon_on_cancel=True,
        )
        reports: list[NodeReport] = []
        for node_id, ref in joining.items():
            member = self.members[node_id]
            if ref not in ready:
                self._refuse(
                    member,
                    (f"its agent did not join within {self.options.join_timeout_s:g} s",),
                )
                continue
            try:
                data = await trio.to_thread.run_sync(self.ray.get, ref, abandon_on_cancel=True)
                reports.append(decode_report(data))
            except Exception as exc:  # the agent could not start there
                self._refuse(member, (f"its agent could not start: {_first_line(exc)}",))
        if self.reference is None:
            self.reference = image_reference(reports)
        accepted, refused = judge(
            reports, implementation=implementation(), reference=self.reference
        )
        for report in accepted:
            member = self.members[report.node_id]
            member.report = report
            member.state = ACCEPTED
        for refusal in refused:
            self._refuse(self.members[refusal.node_id], refusal.reasons)

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
            if member.agent is not None:
                self._kill(member.agent)
                member.agent = None
            self._wake.set()

    def not_accepted(self, node_id: str) -> None:
        """A relay landed on a node without an accepted agent: exclude it, look again."""
        if node_id not in self.members:
            self.members[node_id] = Member(node_id=node_id, name=node_id[:12], resources={})
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
        """Each live agent cancels its runs; returns when they have removed their containers
        (or the agents are gone)."""
        calls = [m.agent.cancel_all.remote() for m in self.members.values() if m.agent]
        if calls:
            await trio.to_thread.run_sync(
                lambda: self.ray.wait(calls, num_returns=len(calls), timeout=AGENT_CALL_TIMEOUT_S)
            )

    async def stop(self) -> None:
        """Close every agent (engine and trio thread), then end its actor."""
        agents = [m.agent for m in self.members.values() if m.agent is not None]
        calls = [agent.close.remote() for agent in agents]
        if calls:
            await trio.to_thread.run_sync(
                lambda: self.ray.wait(calls, num_returns=len(calls), timeout=AGENT_CALL_TIMEOUT_S)
            )
        for agent in agents:
            self._kill(agent)
        for member in self.members.values():
            member.agent = None

    def _kill(self, agent: Any) -> None:
        with contextlib.suppress(Exception):  # already gone with its node
            self.ray.kill(agent, no_restart=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
