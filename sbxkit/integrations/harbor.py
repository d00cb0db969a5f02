"""sbxkit as a Harbor environment:
``harbor run --env sbxkit.integrations.harbor:SbxkitEnvironment``.

Installed with ``pip install '.[harbor]'`` from the clone (Harbor needs Python 3.12). Each
trial gets one
hardened, supervised sbxkit sandbox (``sbxkit.aio.open_sandbox``): a workspace with root inside
(where that is provably not the host's root), the task's image writable under its
``storage_mb``, no network, the task's ``cpus`` and ``memory_mb`` as hard limits. It is removed
when Harbor stops the environment, when the trial is cancelled (Ctrl-C), and by the supervisor
if the Harbor process dies. Options (``--ek key=value``): ``profile`` (a sbxkit profile, for
the defaults a task leaves open and the operator's settings), ``socket`` (the daemon's),
``lifetime`` (seconds the sandbox may live) and ``offline`` (run a task that asks for the
public internet with no network at all). What is refused, and why: docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from pydantic import Field

from sbxkit import aio
from sbxkit._plan.plan import check_spec
from sbxkit.errors import SandboxExpired, SandboxUnusable, SpecError
from sbxkit.integrations._harbor_spec import (
    TaskShape,
    definition_refusal,
    exec_argv,
    trial_spec,
)

ENVIRONMENT_TYPE = "sbxkit"
KILLED_CODE = 137
"""The shell's code for a command ended by SIGKILL, as ``docker exec`` reports it."""
TRANSFER_MAX_BYTES = 4 * 2**30
"""One file in or out (Harbor moves whole directories as one tar.gz this way)."""


class SbxkitOptions(EnvironmentOptions):  # type: ignore[misc]  # Harbor ships no types
    """``--ek`` options of the sbxkit environment."""

    profile: str | None = Field(
        default=None,
        description="A sbxkit profile (TOML): limits, workspace and operator settings the "
        "task leaves open. Its network must be unset: the task's network_mode decides.",
    )
    socket: str | None = Field(
        default=None,
        description="The Docker daemon's socket (default: $DOCKER_HOST, then the standard places).",
    )
    lifetime: float | None = Field(
        default=None,
        gt=0,
        description="Seconds the sandbox may live (default: the profile's timeout, else 4 h).",
    )
    offline: bool = Field(
        default=False,
        description="Run a task whose network_mode is public with no network at all, instead "
        "of refusing it.",
    )


class SbxkitEnvironment(BaseEnvironment):  # type: ignore[misc]  # Harbor ships no types
    """One trial's sbxkit sandbox (see the module doc)."""

    options_model = SbxkitOptions
    options: SbxkitOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stack: contextlib.AsyncExitStack | None = None
        self._sandbox: aio.AioSandbox | None = None
        self._deadline = math.inf
        self._lifetime = math.inf
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # Public internet is no capability flag: _validate_definition refuses it by name.
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # sbxkit's limits are ceilings (cgroup limits), never reservations.
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Bad options and a bad profile fail the job before any trial is queued."""
        options = cls.parse_options(kwargs)
        assert isinstance(options, SbxkitOptions)
        if options.profile is not None:
            trial_spec(TaskShape(image="preflight"), profile=Path(options.profile))

    # -- refusals, before anything exists ----------------------------------------------------

    def _validate_definition(self) -> None:
        refusal = definition_refusal(self.environment_dir, self.task_env_config.docker_image)
        if refusal is not None:
            raise SpecError("environment", refusal)
        if self.task_env_config.docker_image is None:
            raise SpecError(
                "environment",
                f"{self.environment_dir}: the task names no docker_image; sbxkit runs a local "
                "image the task names in [environment] docker_image",
            )
        if self._host_mounts:
            raise SpecError(
                "--mounts",
                "sbxkit takes host mounts only from a profile's [[sandbox.docker.mounts]], "
                "where the operator's enable_bind_mounts governs them",
            )
        for policy in (self._network_policy, *self._phase_network_policies):
            if policy.network_mode == NetworkMode.PUBLIC and not self.options.offline:
                raise SpecError(
                    "network_mode",
                    "'public' (the default, or allow_internet = true): sbxkit gives a "
                    "sandbox no internet; set network_mode = 'no-network' in the task's "
                    "[environment], or pass --ek offline=true to run it without a network",
                )

    def _task_shape(self) -> TaskShape:
        image = self.task_env_config.docker_image
        assert image is not None  # _validate_definition
        cpus = self._effective_cpus
        return TaskShape(
            image=image,
            cpus=float(cpus) if cpus is not None else None,
            memory_mb=self._effective_memory_mb,
            storage_mb=self._effective_storage_mb,
            env=self._startup_env(),
            workdir=self.task_env_config.workdir,
            session=self.session_id,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        refusal = definition_refusal(
            self.environment_dir, self.task_env_config.docker_image, force_build=force_build
        )
        if refusal is not None:
            raise SpecError("environment", refusal)
        profile = Path(self.options.profile) if self.options.profile is not None else None
        spec, settings = trial_spec(
            self._task_shape(), profile=profile, lifetime_s=self.options.lifetime
        )
        check_spec(spec, settings)  # every field's rule, before the daemon is asked anything
        stack = contextlib.AsyncExitStack()
        # Before the open: the session's own clock starts later, so past this it has ended.
        self._deadline = time.monotonic() + spec.limits.timeout_s
        self._sandbox = await stack.enter_async_context(
            aio.open_sandbox(
                spec, files_root="/", settings=settings, socket_path=self.options.socket
            )
        )
        self._stack = stack
        self._lifetime = spec.limits.timeout_s
        self.logger.debug(f"sbxkit sandbox {self._sandbox.container_id[:12]} started")
        try:
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

    async def stop(self, delete: bool) -> None:
        """Remove the sandbox (sbxkit keeps none: ``delete=False`` changes nothing)."""
        stack, sandbox = self._stack, self._sandbox
        self._stack, self._sandbox = None, None
        if stack is None or sandbox is None:
            return
        try:
            await stack.aclose()
        except SandboxExpired as expired:
            # Removed already, on time: the call that met the end has said so.
            self.logger.debug(str(expired))
        self.logger.debug(f"sbxkit sandbox {sandbox.container_id[:12]} removed")

    @contextlib.contextmanager
    def _box(self) -> Iterator[aio.AioSandbox]:
        """The sandbox, its end named: a call after its lifetime raises the session's
        ``SandboxExpired``, not the bare "unusable" sbxkit answers once it is gone."""
        box = self._sandbox
        if box is None:
            raise RuntimeError("the sbxkit sandbox is not running (start it first)")
        try:
            yield box
        except SandboxUnusable as exc:
            if time.monotonic() >= self._deadline:
                raise SandboxExpired(box.lease, box.container_id, self._lifetime) from exc
            raise

    # -- exec ---------------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """``bash -c command`` as root inside the workspace, or as ``user`` (dropped to it by
        ``setpriv``, which the image must have). A timeout kills the command's whole process
        group and raises, as Harbor's Docker environment does."""
        with self._box() as box:
            result = await box.exec(
                exec_argv(command, self._resolve_user(user)),
                timeout=timeout_sec,
                workdir=cwd or self.task_env_config.workdir,
                env=self._merge_env(env),
            )
        if result.status == "timed_out":
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        if result.status == "output_exceeded":
            raise RuntimeError(
                f"Command's {result.overflowed} passed the sandbox's output bound "
                "(output_bytes; raise it in the profile's [sandbox.docker.limits] max_output)"
            )
        if result.status == "disk_exceeded":
            raise RuntimeError(f"the sandbox passed its disk bound: {result.kill_evidence}")
        stdout = result.stdout.decode("utf-8", "replace")
        stderr = result.stderr.decode("utf-8", "replace")
        callback = self._output_callback()
        if callback is not None:
            for text, stream in ((stdout, "stdout"), (stderr, "stderr")):
                if text:
                    await callback(text, stream)
        code = result.exit_code if result.exit_code is not None else KILLED_CODE
        return ExecResult(stdout=stdout, stderr=stderr, return_code=code)

    # -- files --------------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        target = PurePosixPath(target_path)
        with self._box() as box:
            await box.put_files({target.name: data}, str(target.parent), max_bytes=len(data) or 1)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        with self._box() as box:
            await box.put_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        with self._box() as box:
            files = await box.get_files([source_path], max_bytes=TRANSFER_MAX_BYTES)
        await asyncio.to_thread(_write_file, Path(target_path), files[source_path])

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Into a fresh directory first (sbxkit writes only there), then over ``target_dir``:
        Harbor's contract overwrites what is there."""
        target = Path(target_dir)
        staging = await asyncio.to_thread(_staging_beside, target)
        try:
            fresh = Path(staging) / "tree"
            with self._box() as box:
                await box.get_dir(source_dir, fresh)
            await asyncio.to_thread(shutil.copytree, fresh, target, dirs_exist_ok=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _write_file(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _staging_beside(target: Path) -> str:
    """``target`` made if missing, and an empty directory beside it (the same filesystem)."""
    target.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=".sbxkit-", dir=target.parent)
