"""``RayCluster``: ``run_many(jobs, parallel=N, cluster=RayCluster("HEAD:6379"))``."""

from __future__ import annotations

from sbxkit._consumers.harness import ClusterBatch, JobResult
from sbxkit._util.public import publish
from sbxkit.cluster.options import ClusterOptions


class RayCluster(ClusterOptions):
    __doc__ = ClusterOptions.__doc__

    async def run_jobs(self, batch: ClusterBatch) -> list[JobResult]:
        """``run_many``'s cluster path (harness.ClusterRunner)."""
        from sbxkit.cluster.driver import run_on_cluster  # imports Ray

        return await run_on_cluster(self, batch)


publish(__name__, globals())  # public names show as sbxkit.NAME
