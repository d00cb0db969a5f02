"""Batches across a Ray cluster, each node keeping its own supervisor's guarantees.

``run_many(jobs, parallel=N, cluster=RayCluster("HEAD:6379"))`` and ``sbxkit batch --ray
HEAD:6379`` run a batch on a Ray cluster (docs/cluster.md). Ray decides membership, placement
and failure detection; each node's sbxkit agent and supervisor admit, harden and remove the
sandboxes there. The cluster runs Ray's token authentication, and every report, job and
result crossing it is sealed with a cluster secret the driver and the sandbox nodes share. Ray
is an optional extra (``sbxkit[ray]``), imported only when a batch runs.
"""

from __future__ import annotations

from sbxkit.cluster.api import RayCluster
from sbxkit.cluster.join import NodeRefusal
from sbxkit.errors import ClusterUnauthenticated, ClusterUnavailable

__all__ = ["ClusterUnauthenticated", "ClusterUnavailable", "NodeRefusal", "RayCluster"]
