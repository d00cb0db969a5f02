"""Where a cluster batch runs and how (pure options; ``RayCluster`` in ``api.py`` adds the run).

Nothing here imports Ray: the extra (``sbxkit[ray]``) is needed only when the batch runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping

from sbxkit._consumers.harness import JobId
from sbxkit.cluster.join import NodeRefusal
from sbxkit.errors import SpecError

RefusalCallback = Callable[[NodeRefusal], object]


DEFAULT_RETRIES = 1
JOIN_TIMEOUT_S = 120.0


class ClusterOptions:
    """Run a batch on the Ray cluster at ``address`` (``"HOST:PORT"`` of its head, or
    ``"auto"``): ``run_many(jobs, parallel=..., cluster=sbxkit.RayCluster(address))``.

    Each sandbox node runs one sbxkit agent for the batch; Ray places each job on a node whose
    advertised budget has room, and that node's supervisor admits, hardens and removes the
    sandbox as for a local run (docs/cluster.md). A job whose node (or agent) is lost mid-run
    is retried on another up to ``retries`` times; ``on_result`` hears every attempt (a lost
    one has ``JobResult.lost``). A node that cannot run the batch — no engine, a different
    sbxkit, an image missing or different — is refused by name when it joins and
    ``on_refused`` hears why. ``previous_attempts`` (job id → attempts already recorded, e.g.
    lost lines of a results file) continues the attempt count of a resumed batch.
    ``join_timeout_s`` bounds how long a node may take to start its agent and join, and how
    long the batch waits for a node when none is left. ``nodes`` (node names, as Ray lists
    them) restricts the batch to those nodes; the others are left alone.

    The cluster must enforce Ray's token authentication (asked of it before anything is sent:
    ``ClusterUnauthenticated`` otherwise), and this process needs Ray's token and the cluster
    secret (``SBXKIT_CLUSTER_SECRET_FILE``) that the sandbox nodes hold (docs/cluster.md).
    """

    def __init__(
        self,
        address: str,
        *,
        retries: int = DEFAULT_RETRIES,
        on_refused: RefusalCallback | None = None,
        previous_attempts: Mapping[JobId, int] | None = None,
        join_timeout_s: float = JOIN_TIMEOUT_S,
        namespace: str = "sbxkit",
        nodes: Collection[str] | None = None,
    ) -> None:
        if not isinstance(address, str) or not address.strip():
            raise SpecError("cluster.address", "must be the Ray head's HOST:PORT (or 'auto')")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise SpecError("cluster.retries", f"must be an integer >= 0, got {retries!r}")
        if (
            isinstance(join_timeout_s, bool)
            or not isinstance(join_timeout_s, int | float)
            or not math.isfinite(join_timeout_s)
            or join_timeout_s <= 0
        ):
            raise SpecError("cluster.join_timeout_s", "must be a finite number > 0")
        self.address = address.strip()
        self.retries = retries
        self.on_refused = on_refused
        self.previous_attempts = dict(previous_attempts or {})
        self.join_timeout_s = float(join_timeout_s)
        self.namespace = namespace
        if nodes is not None and (
            isinstance(nodes, str) or not nodes or not all(isinstance(n, str) for n in nodes)
        ):
            raise SpecError("cluster.nodes", "must be a non-empty collection of node names")
        self.nodes = None if nodes is None else frozenset(nodes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r}, retries={self.retries})"
