"""``RayCluster``: ``run_many(jobs, parallel=N, cluster=RayCluster("HEAD:6379"))``."""

from __future__ import annotations

from collections.abc import Sequence

from sbxkit._consumers.harness import Job, JobResult, Need, ResultCallback, StartCallback
from sbxkit._model.settings import Settings
from sbxkit._util.public import publish
from sbxkit.cluster.options import ClusterOptions


class RayCluster(ClusterOptions):
    __doc__ = ClusterOptions.__doc__

    async def run_jobs(
        self,
        jobs: Sequence[Job],
        needs: Sequence[Need],
        *,
        parallel: int,
        on_result: ResultCallback | None,
        on_start: StartCallback | None,
        settings: Settings | None,
        capacity_wait_s: float,
    ) -> list[JobResult]:
        """``run_many``'s cluster path (harness.ClusterRunner)."""
        from sbxkit.cluster.driver import run_on_cluster  # imports Ray

        return await run_on_cluster(
            self,
            jobs,
            needs,
            parallel=parallel,
            on_result=on_result,
            on_start=on_start,
            settings=settings,
            capacity_wait_s=capacity_wait_s,
        )


publish(__name__, globals())  # public names show as sbxkit.NAME
