"""One-shot file grants: inputs as private snapshots, outputs staged and published with receipts.

The payload never sees the operator's live directories. The spec's configured bind mounts are
only *ceilings*: every granted path must lie inside one (outputs inside one with
``read_only = false``), and none of them is passed to Docker. Instead:

- **Inputs** are opened without following a link in any component (a walk from ``/`` with
  ``O_NOFOLLOW``), must be regular files with exactly one link and at most ``max_bytes``, and
  are copied — hashing as they go — into a private broker directory (0700). Each copy is
  mode 0444, owned by the broker, and bind-mounted read-only at its ``target``.
- **Outputs** are written by the payload into a private staging directory, bind-mounted
  read-write at ``output_dir``. Nothing is published unless the run returned (the container's
  removal confirmed: ``run`` raises otherwise) and the success criterion holds. Then each
  staged file is re-checked (opened without following links, regular, one link, within
  ``max_bytes``), copied into a temp file inside the held destination parent, fsync'd,
  published with ``link(2)`` — which never replaces an existing name — and the parent is
  fsync'd. Each publication yields a ``Receipt`` of path, bytes and sha256.
- The per-file size limit (``RLIMIT_FSIZE``) becomes the smaller of the spec's and the largest
  output's ``max_bytes``: grants tighten it, never loosen it.

The broker's directory is removed whatever happens (error, cancellation). Host parents of the
granted paths must stay under the operator's control: the no-link walk refuses links that exist
when a path is opened, but a concurrent rename of a parent directory by another host account is
outside what any path-based check can rule out (see ``docs/grants.md``).

Blocking file work runs in worker threads so the event loop never waits on the disk.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Unpack

import msgspec
import trio

from sbxkit._consumers.grant_files import (
    DIR_FLAGS,
    STAGING_MODE,
    open_directory,
    publish_outputs,
    snapshot_input,
)
from sbxkit._consumers.grants import (
    DEFAULT_INPUT_MAX_BYTES,
    GrantResult,
    Grants,
    InputGrant,
    OutputGrant,
    Receipt,
    check_grants,
    derive_spec,
    exited_zero,
)
from sbxkit._model.mounts import BindMount, is_within, validate_mounts
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec, parse_user, validate_limits
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.public import publish
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerOptions, docker_backend
from sbxkit.errors import GrantError

__all__ = [
    "DEFAULT_INPUT_MAX_BYTES",
    "GrantError",
    "GrantResult",
    "Grants",
    "InputGrant",
    "OutputGrant",
    "Receipt",
    "check_grants",
    "derive_spec",
    "exited_zero",
    "open_directory",
    "publish_outputs",
    "run_with_grants",
    "snapshot_input",
]


# --- the broker's private directory ------------------------------------------------------------


@dataclass
class _Workspace:
    root: str
    root_fd: int
    inputs_fd: int
    staging_fd: int = -1

    @property
    def staging(self) -> str:
        return posixpath.join(self.root, "out")

    def snapshot(self, index: int) -> str:
        return posixpath.join(self.root, "in", str(index))


def _open_workspace(
    work_dir: str | None, owner: tuple[int, int] | None, staging: bool
) -> _Workspace:
    """A fresh private directory (0700): ``in/`` for snapshots, ``out/`` for staging.

    The staging directory belongs to the sandbox user ``owner`` (mode 0700) when the broker can
    chown, else — a broker that is neither root nor the sandbox user, or a sandbox whose own
    uid is not chosen yet (``owner`` None) — it is mode 0777 and private only through the 0700
    root above it.
    """
    try:
        root = tempfile.mkdtemp(prefix="sbxkit-grants-", dir=work_dir)
    except OSError as exc:
        raise GrantError("work_dir", str(work_dir), f"cannot create: {exc.strerror}") from None
    ws = _Workspace(root=root, root_fd=-1, inputs_fd=-1)
    try:
        ws.root_fd = os.open(root, DIR_FLAGS)
        os.mkdir("in", 0o700, dir_fd=ws.root_fd)
        ws.inputs_fd = os.open("in", DIR_FLAGS, dir_fd=ws.root_fd)
        if staging:
            os.mkdir("out", 0o700, dir_fd=ws.root_fd)
            ws.staging_fd = os.open("out", DIR_FLAGS, dir_fd=ws.root_fd)
            euid = os.geteuid()
            if owner is not None and euid == 0:
                os.fchown(ws.staging_fd, *owner)
                os.fchmod(ws.staging_fd, STAGING_MODE)
            elif owner is None or euid != owner[0]:
                os.fchmod(ws.staging_fd, 0o777)
    except BaseException as exc:
        problem = _dispose(ws)
        if problem is not None:
            exc.add_note(problem)
        if isinstance(exc, OSError):
            raise GrantError("work_dir", root, f"cannot prepare: {exc.strerror}") from None
        raise
    return ws


def _remove_workspace_path(root: str) -> str | None:
    try:
        shutil.rmtree(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"the broker directory {root} could not be removed: {exc}"
    return None


def _dispose(ws: _Workspace) -> str | None:
    for fd in (ws.staging_fd, ws.inputs_fd, ws.root_fd):
        if fd >= 0:
            os.close(fd)
    ws.staging_fd = ws.inputs_fd = ws.root_fd = -1
    return _remove_workspace_path(ws.root)


def _snapshot_all(inputs: Sequence[InputGrant], ws: _Workspace) -> list[Receipt]:
    return [
        snapshot_input(grant, ws.inputs_fd, str(index), label=f"grants.inputs[{index}]")
        for index, grant in enumerate(inputs)
    ]


# --- the entry point ---------------------------------------------------------------------------


async def run_with_grants(
    spec: SandboxSpec,
    grants: Grants,
    stdin: bytes | None = None,
    *,
    success: Callable[[RunResult], bool] = exited_zero,
    work_dir: str | None = None,
    backend: Backend | None = None,
    **docker: Unpack[DockerOptions],
) -> GrantResult:
    """Run ``spec`` once with file grants; publish outputs only after a successful run.

    ``spec.mounts``' bind mounts are the ceilings (they need ``enable_bind_mounts`` like any
    bind mount) and are not mounted; the payload sees only the snapshots (read-only, at each
    input's ``target``) and the staging directory (at ``grants.output_dir``). ``success``
    decides, from the run's result, whether outputs are published (default: exit status 0).
    ``work_dir`` is where the broker's private directory is made (default: the system temp
    directory); it must be visible to the Docker daemon at the same path.

    Raises SpecError for malformed grants or grants outside the ceilings and GrantError for
    an input refused while snapshotting — in both cases before any container exists — and
    GrantError for an output refused while publishing (after removal). Errors from ``run``
    (including CleanupError) propagate and nothing is published. The broker's directory is
    removed in every case, cancellation included.
    """
    chosen = docker_backend(backend, **docker)
    checked = chosen.check(spec, "grants")
    check_grants(checked.spec, grants, checked.settings)
    # A spec that names no user runs as a uid of its own, chosen when the run is planned:
    # its staging directory is then 0777, private through the 0700 directory above it.
    owner = parse_user(checked.spec.user) if checked.spec.user is not None else None
    ws = await trio.to_thread.run_sync(_open_workspace, work_dir, owner, bool(grants.outputs))
    try:
        outcome = await _run_in(ws, checked, grants, stdin, chosen, success)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            problem = await trio.to_thread.run_sync(_dispose, ws)
        if problem is not None:
            exc.add_note(problem)
        raise
    with trio.CancelScope(shield=True):
        problem = await trio.to_thread.run_sync(_dispose, ws)
    if problem is not None:
        raise GrantError(
            "work_dir", ws.root, problem, published=outcome.receipts, result=outcome.result
        )
    return outcome


async def _run_in(
    ws: _Workspace,
    checked: CheckedSpec,
    grants: Grants,
    stdin: bytes | None,
    backend: Backend,
    success: Callable[[RunResult], bool],
) -> GrantResult:
    inputs = await trio.to_thread.run_sync(_snapshot_all, grants.inputs, ws)
    snapshots = [ws.snapshot(index) for index in range(len(grants.inputs))]
    derived = derive_spec(checked.spec, grants, snapshots, ws.staging if grants.outputs else None)
    # The only bind mounts left are the broker's own; enabling them enables nothing else.
    for mount in derived.mounts:
        if isinstance(mount, BindMount) and not is_within(mount.source, ws.root):
            raise AssertionError(f"bind source {mount.source} is not the broker's")
    settings = msgspec.structs.replace(checked.settings, enable_bind_mounts=True)
    # Only the mounts and fsize changed from the checked spec: check those, not all of it.
    validate_mounts(
        derived.mounts,
        enable_bind_mounts=True,
        enable_named_volumes=settings.enable_named_volumes,
        state_dir=settings.supervisor_state_dir,
    )
    validate_limits(derived.limits)
    result = await backend.run_once(CheckedSpec(spec=derived, settings=settings), stdin)
    if not success(result):
        return GrantResult(result=result, receipts=[], inputs=inputs, published=False)
    if not grants.outputs:
        return GrantResult(result=result, receipts=[], inputs=inputs, published=True)
    labels = [f"grants.outputs[{index}]" for index in range(len(grants.outputs))]
    try:
        receipts = await trio.to_thread.run_sync(
            lambda: publish_outputs(ws.staging_fd, grants.outputs, labels=labels)
        )
    except GrantError as exc:
        exc.result = result
        raise
    return GrantResult(result=result, receipts=receipts, inputs=inputs, published=True)


publish(__name__, globals())  # public names show as sbxkit.NAME
