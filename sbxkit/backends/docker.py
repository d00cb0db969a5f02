"""The Docker backend: the runner interface over ``sbxkit.runner.run``, and nothing else.

``run_once`` is a call to ``sbxkit.runner.run`` with the arguments this object was built with:
the same validation, the same create body (``sbxkit.policy.build_create_body``), the same owner
and the same removal. Nothing here builds, encodes or alters a request; a test encodes the body
through both paths and compares the bytes.

Cleanup ownership stays where design.md §4 puts it. With the default owner, the supervisor
journals every lease and recovers orphans itself at its start and in its reaper loop;
``reconcile_orphans`` asks it for one more pass now (``sbxkit leases recover``). With an
explicit in-process owner there is nothing durable to recover, so it returns ``[]``.
"""

from __future__ import annotations

from pathlib import Path

from sbxkit import runner
from sbxkit.engine.client import Engine, open_engine
from sbxkit.gpu import GpuCursor
from sbxkit.owner import Owner
from sbxkit.result import RunResult
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec

__all__ = ["DockerBackend"]


class DockerBackend:
    """Hardened Docker containers, through ``sbxkit.runner.run`` (design.md §3)."""

    kind = "docker"

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        settings: Settings | None = None,
        engine: Engine | None = None,
        owner: Owner | None = None,
        gpu_cursor: GpuCursor | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.settings = settings
        self.engine = engine
        self.owner = owner
        self.gpu_cursor = gpu_cursor

    async def preflight(self) -> None:
        """The engine answers ``/_ping`` with a usable API version (EngineUnavailable if not).

        Skipped when an engine was handed in: its owner already negotiated with the daemon.
        """
        if self.engine is None:
            async with open_engine(self.socket_path):
                pass

    async def run_once(self, spec: SandboxSpec, stdin: bytes | None = None) -> RunResult:
        return await runner.run(
            spec,
            stdin,
            engine=self.engine,
            owner=self.owner,
            socket_path=self.socket_path,
            settings=self.settings,
            gpu_cursor=self.gpu_cursor,
        )

    async def reconcile_orphans(self) -> list[str]:
        """One supervisor recovery pass now (the report's lines); ``[]`` for an own owner."""
        if self.owner is not None:
            return []
        from sbxkit.supervisor import admin
        from sbxkit.supervisor.wire import Recover

        settings = runner.effective_settings(self.settings)
        assert settings.supervisor_state_dir is not None
        report = await admin.request(Path(settings.supervisor_state_dir), Recover())
        return list(report.lines)

    async def aclose(self) -> None:
        """Nothing to release: every run opened and closed its own engine connection."""
